"""One driver per study: a second one is refused while the first holds a live lease; a dead driver's lease lapses."""

import json
import socket
import subprocess
import time

import pytest

from study.errors import StoreError
from study.store import Store
from study.store.lease import StudyLease, lease_file


def test_a_second_driver_is_refused_while_the_first_runs_and_may_start_after(tmp_path):
    store = Store(tmp_path)
    with store.lease("s"):
        with pytest.raises(StoreError, match="study 's' is already running: a driver .* holds .*_leases/s.json"), \
                store.lease("s"):
            pass
        with store.lease("other"):  # other studies are free
            pass
    with store.lease("s"):  # released at the end: the next run starts
        pass
    assert store.get_text(lease_file("s")) is None


def test_the_lease_is_renewed_while_its_driver_runs(tmp_path):
    store = Store(tmp_path)
    with StudyLease(store._root, "s", lease_s=0.6, renew_s=0.1):
        first = json.loads(store.get_text(lease_file("s")))["renewed"]
        time.sleep(0.8)  # longer than the lease: still live, because it is renewed
        assert json.loads(store.get_text(lease_file("s")))["renewed"] > first
        with pytest.raises(StoreError, match="already running"):
            StudyLease(store._root, "s", lease_s=0.6).refuse_if_held()


def test_the_lease_of_a_driver_that_died_lapses(tmp_path):
    store = Store(tmp_path)
    gone = subprocess.Popen(["true"])
    gone.wait()
    here = {"owner": "killed", "host": socket.gethostname(), "pid": gone.pid, "started": "now", "renewed": time.time()}
    store.put_text(lease_file("s"), json.dumps(here))  # a driver on this machine that was killed a moment ago
    with store.lease("s"):
        pass
    dead = {"owner": "gone", "host": "h", "pid": 1, "started": "then", "renewed": time.time() - 3600}
    store.put_text(lease_file("s"), json.dumps(dead))
    with store.lease("s"):
        assert json.loads(store.get_text(lease_file("s")))["owner"] != "gone"
    store.put_text(lease_file("s"), "{not json")  # a damaged lease protects nothing
    with store.lease("s"):
        pass
