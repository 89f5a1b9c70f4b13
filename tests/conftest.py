"""Shared fixtures. Ray runs for real: a head and two worker nodes as separate processes, all on 127.0.0.1."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ["RAY_AUTH_MODE"] = "disabled"  # local test clusters: no token files to pass around
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def local_cluster(*args: str) -> str:
    proc = subprocess.run([sys.executable, str(REPO / "cluster" / "local_cluster.py"), *args],
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"local_cluster {args}: {proc.stdout[-2000:]} {proc.stderr[-2000:]}")
    return proc.stdout


@pytest.fixture(scope="session")
def ray_cluster():
    """Head (0 CPUs, job server on 127.0.0.1:8266) + workers w1, w2 (1 CPU each). Stopped at the end: only this
    cluster's processes (a Ray the user runs beside the tests is left alone)."""
    local_cluster("stop", "--port", "6391")  # leftovers of an earlier run of this same test cluster, if any
    info = json.loads(local_cluster("start", "--workers", "2", "--port", "6391", "--dashboard-port", "8266"))
    try:
        yield info
    finally:
        local_cluster("stop", "--port", "6391")
