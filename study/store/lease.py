"""One driver per study at a time: a lease under the root (`_leases/<study>.json`), renewed while the driver runs.

A second driver that finds a live lease (renewed within LEASE_S) refuses to start, naming the first; a lease whose
driver died stops being renewed and is taken over LEASE_S later, or at once on the machine it ran on (its process
is gone). Trials write only their own files, so two drivers
would never corrupt results, but both would run every pending trial: the work doubled.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from datetime import UTC, datetime

from study.errors import StoreError
from study.store.files import Root

LEASE_S = 60.0  # a lease not renewed for this long belongs to a driver that is gone
RENEW_S = 15.0


def pid_alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, ValueError, TypeError):
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def lease_file(study: str) -> str:
    return f"_leases/{study}.json"


class StudyLease:
    """A context manager: `with StudyLease(root, study): run the study`. StoreError when another driver holds it."""

    def __init__(self, root: Root, study: str, lease_s: float = LEASE_S, renew_s: float = RENEW_S):
        self.root, self.study, self.lease_s, self.renew_s = root, study, lease_s, renew_s
        self.rel = lease_file(study)
        self.me = {"owner": uuid.uuid4().hex, "host": socket.gethostname(), "pid": os.getpid(),
                   "started": datetime.now(UTC).isoformat(timespec="seconds")}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def holder(self) -> dict | None:
        """The live lease of another driver, if any."""
        try:
            text = self.root.get_text(self.rel)
            held = json.loads(text) if text else None
        except (StoreError, ValueError):
            return None  # a damaged lease protects nothing: take it over
        if not isinstance(held, dict) or held.get("owner") == self.me["owner"]:
            return None
        if held.get("host") == self.me["host"] and not pid_alive(held.get("pid")):
            return None  # its driver ran here and is gone (killed): no need to wait for the lease to lapse
        return held if time.time() - float(held.get("renewed", 0)) < self.lease_s else None

    def _write(self) -> None:
        self.root.put_text(self.rel, json.dumps({**self.me, "renewed": time.time()}))

    def _renew(self) -> None:
        while not self._stop.wait(self.renew_s):
            with contextlib.suppress(OSError):  # a store out of reach for a moment: try again next time
                self._write()

    def refuse_if_held(self) -> None:
        """StoreError naming the driver that holds the study, if one does."""
        held = self.holder()
        if held is not None:
            raise StoreError(
                f"study {self.study!r} is already running: a driver (pid {held.get('pid')} on {held.get('host')}, "
                f"since {held.get('started')}) holds {self.root.root}/{self.rel}. Wait for it to finish (loopstudy "
                f"status {self.study}); if that driver is gone, its lease lapses {self.lease_s:.0f} s after it died")

    def __enter__(self) -> StudyLease:
        self.refuse_if_held()
        self._write()
        self._thread = threading.Thread(target=self._renew, name=f"lease-{self.study}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            text = self.root.get_text(self.rel)
            if text and json.loads(text).get("owner") == self.me["owner"]:
                self.root.fs.delete_file(f"{self.root.root}/{self.rel}")
        except (OSError, StoreError, ValueError):
            pass  # it lapses by itself
