#!/usr/bin/env python
"""Start or stop a multi-node Ray cluster on this machine, every node on 127.0.0.1 (tests and demos).

    python cluster/local_cluster.py start --workers 2        # head (0 CPUs, job server) + 2 one-CPU workers
    python cluster/local_cluster.py add-worker --name w3     # one more worker node
    python cluster/local_cluster.py stop                     # only this cluster's processes (by --port)

`--no-log-monitor` (start, add-worker): no node forwards its workers' output to the drivers (`--verbose` drivers
then show no trial's prints); each node's log monitor otherwise scans the cluster's logs every second, about 2% of
a core (the tests' clusters run without).

Prints the addresses as JSON: {"address": "127.0.0.1:6390", "dashboard": "http://127.0.0.1:8265", "auth": "token",
"token_path": "/root/.ray/auth_token"}. Then: `loopstudy run SPEC --address 127.0.0.1:6390` or `loopstudy submit SPEC
--address http://127.0.0.1:8265`.

Every node runs Ray's token authentication (RAY_AUTH_MODE=token): the GCS and the job server refuse a client
without the cluster's token (Ray's job API runs arbitrary code for whoever reaches it). The token is the file
RAY_AUTH_TOKEN_PATH names, else ~/.ray/auth_token, made (random, mode 600) when it does not exist; a client on this
machine finds it there. `--no-auth` (or RAY_AUTH_MODE=disabled in the environment) starts a cluster without.

Why the wrapper around `ray start`: Ray swaps a --node-ip-address of 127.0.0.1 for the machine's outward IP
(services.resolve_ip_for_localhost). We keep the address as given, so every node and all traffic stay on loopback.
Worker nodes carry a custom resource named after them ({"w1": 1}) so tests can tell them apart.

`stop` ends only the processes of the cluster on --port (never `ray stop --force`, which would also end a user's
own Ray on the same machine): those whose command line names its GCS address or its temp dir
(/tmp/loopstudy-ray-<port>), and their descendants (workers and agents, whose titles name neither).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time

RAY_START = """
import sys
import ray._private.services as services
services.resolve_ip_for_localhost = lambda host: host  # keep 127.0.0.1: nothing leaves loopback
from ray.scripts.scripts import main
sys.argv = ["ray", *sys.argv[1:]]
main()
"""


def token_path() -> str:
    """The cluster's token file: RAY_AUTH_TOKEN_PATH, else Ray's default, ~/.ray/auth_token."""
    return os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.expanduser("~/.ray/auth_token")


def auth_env(auth: bool) -> dict[str, str]:
    """The environment of every `ray start`: token authentication with the token file (made when missing), or
    none."""
    if not auth:
        return {"RAY_AUTH_MODE": "disabled"}
    path = token_path()
    try:
        with open(path) as f:
            present = bool(f.read().strip())
    except OSError:
        present = False
    if not present:
        import secrets

        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": path}


def ray(args: list[str], env: dict[str, str] | None = None, retries: int = 1) -> None:
    """Run `ray ARGS` through the wrapper; a start on a loaded machine may time out once, so retry."""
    for attempt in range(retries + 1):
        proc = subprocess.run([sys.executable, "-c", RAY_START, *args], env={**os.environ, **(env or {})},
                              capture_output=True, text=True)
        if proc.returncode == 0:
            return
        if attempt == retries:
            sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
            raise SystemExit(f"ray {' '.join(args[:2])} failed (exit {proc.returncode})")
        time.sleep(2)


def temp_dir(port: int) -> str:
    """The cluster's own temp dir: its sessions, sockets and logs, and a mark on its processes' command lines."""
    return f"/tmp/loopstudy-ray-{port}"


def start_head(port: int, dashboard_port: int, log_monitor: bool = True, auth: bool = True) -> None:
    # The head's processes (and jobs submitted to it) resolve their own IP as loopback.
    ray(["start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=0",
         f"--temp-dir={temp_dir(port)}",
         "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard_port}",
         f"--include-log-monitor={log_monitor}", "--disable-usage-stats"],
        env={"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", **auth_env(auth)})


def add_worker(port: int, name: str, cpus: int, log_monitor: bool = True, auth: bool = True) -> None:
    ray(["start", f"--address=127.0.0.1:{port}", "--node-ip-address=127.0.0.1", f"--num-cpus={cpus}",
         f"--resources={json.dumps({name: 1})}", f"--include-log-monitor={log_monitor}", "--disable-usage-stats"],
        env=auth_env(auth))


def cluster_pids(port: int) -> list[int]:
    """PIDs of the cluster on `port`: processes naming its GCS address or temp dir, plus their descendants."""
    out = subprocess.run(["ps", "-ww", "-eo", "pid=,ppid=,args="], capture_output=True, text=True).stdout
    procs = {}
    for line in out.splitlines():
        pid, ppid, *args = line.split(None, 2)
        procs[int(pid)] = (int(ppid), args[0] if args else "")
    marks = (f"127.0.0.1:{port} ", f"127.0.0.1:{port}\n", f"--gcs_server_port={port} ", temp_dir(port) + "/")
    ours = {pid for pid, (_, args) in procs.items() if any(m in args + "\n" for m in marks)}
    grew = True
    while grew:
        children = {pid for pid, (ppid, _) in procs.items() if ppid in ours} - ours
        ours |= children
        grew = bool(children)
    me, keep = os.getpid(), set()
    while me in procs and me not in keep:  # never this script or whoever called it
        keep.add(me)
        me = procs[me][0]
    return sorted(ours - keep)


def stop(port: int, grace_s: float = 2.0) -> None:
    """End the cluster on `port` and nothing else: SIGTERM, then SIGKILL whatever is left after grace_s (Ray's
    daemons often outlive a SIGTERM by many seconds)."""
    pids = cluster_pids(port)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.time() + grace_s
        while time.time() < deadline and any(alive(p) for p in pids):
            time.sleep(0.2)
        pids = [p for p in pids if alive(p)]
        if not pids:
            return


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie has ended; its parent reaps it
    except OSError:
        return False


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("start", help="head + N worker nodes")
    s.add_argument("--workers", type=int, default=2)
    s.add_argument("--cpus-per-worker", type=int, default=1)
    s.add_argument("--port", type=int, default=6390)
    s.add_argument("--dashboard-port", type=int, default=8265)
    a = sub.add_parser("add-worker", help="one more worker node")
    a.add_argument("--name", required=True)
    a.add_argument("--cpus", type=int, default=1)
    a.add_argument("--port", type=int, default=6390)
    for command in (s, a):
        command.add_argument("--no-log-monitor", dest="log_monitor", action="store_false",
                             help="workers' output stays in the cluster's log files (see above)")
        command.add_argument("--no-auth", dest="auth", action="store_false",
                             help="no token authentication (a local demo only: anyone who reaches the ports can run "
                                  "code); also when RAY_AUTH_MODE=disabled is set")
    st = sub.add_parser("stop", help="stop the cluster on --port (its processes only)")
    st.add_argument("--port", type=int, default=6390)
    args = p.parse_args()
    auth = getattr(args, "auth", True) and os.environ.get("RAY_AUTH_MODE", "").lower() != "disabled"
    if args.cmd == "start":
        start_head(args.port, args.dashboard_port, args.log_monitor, auth)
        for i in range(1, args.workers + 1):
            add_worker(args.port, f"w{i}", args.cpus_per_worker, args.log_monitor, auth)
        print(json.dumps({"address": f"127.0.0.1:{args.port}", "dashboard": f"http://127.0.0.1:{args.dashboard_port}",
                          "auth": "token" if auth else "none", **({"token_path": token_path()} if auth else {})}))
    elif args.cmd == "add-worker":
        add_worker(args.port, args.name, args.cpus, args.log_monitor, auth)
    else:
        stop(args.port)


if __name__ == "__main__":
    main()
