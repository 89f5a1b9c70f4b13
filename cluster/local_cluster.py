#!/usr/bin/env python
"""Start or stop a multi-node Ray cluster on this machine, every node on 127.0.0.1 (tests and demos).

    python cluster/local_cluster.py start --workers 2        # head (0 CPUs, job server) + 2 one-CPU workers
    python cluster/local_cluster.py add-worker --name w3     # one more worker node
    python cluster/local_cluster.py stop

Prints the addresses as JSON: {"address": "127.0.0.1:6390", "dashboard": "http://127.0.0.1:8265"}.
Then: `loopstudy run SPEC --address 127.0.0.1:6390` or `loopstudy submit SPEC --address http://127.0.0.1:8265`.

Why the wrapper around `ray start`: Ray swaps a --node-ip-address of 127.0.0.1 for the machine's outward IP
(services.resolve_ip_for_localhost). We keep the address as given, so every node and all traffic stay on loopback.
Worker nodes carry a custom resource named after them ({"w1": 1}) so tests can tell them apart.
"""

from __future__ import annotations

import argparse
import json
import os
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


def start_head(port: int, dashboard_port: int) -> None:
    # The head's processes (and jobs submitted to it) resolve their own IP as loopback.
    ray(["start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=0",
         "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard_port}",
         "--disable-usage-stats"], env={"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"})


def add_worker(port: int, name: str, cpus: int) -> None:
    ray(["start", f"--address=127.0.0.1:{port}", "--node-ip-address=127.0.0.1", f"--num-cpus={cpus}",
         f"--resources={json.dumps({name: 1})}", "--disable-usage-stats"])


def stop() -> None:
    subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "stop", "--force"], capture_output=True)


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
    sub.add_parser("stop", help="stop every Ray process of this user on this machine")
    args = p.parse_args()
    if args.cmd == "start":
        start_head(args.port, args.dashboard_port)
        for i in range(1, args.workers + 1):
            add_worker(args.port, f"w{i}", args.cpus_per_worker)
        print(json.dumps({"address": f"127.0.0.1:{args.port}", "dashboard": f"http://127.0.0.1:{args.dashboard_port}"}))
    elif args.cmd == "add-worker":
        add_worker(args.port, args.name, args.cpus)
    else:
        stop()


if __name__ == "__main__":
    main()
