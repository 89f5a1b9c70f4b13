"""What a location string is: an object-store URI (s3://bucket/prefix, gs://...) or a path on this machine.

One rule, used by the store, the data-file paths and the launcher's storage checks.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def is_uri(location: str) -> bool:
    """Whether `location` names an object store (scheme://...) rather than a local or NFS path."""
    return "://" in location


def join(location: str, *parts: str) -> str:
    """`location/part/...` for a path or a URI: a URI's query (`?endpoint_override=...&scheme=http`) stays at the
    end, where pyarrow and Tune read it (appended after it, a path part would become part of the query)."""
    base, sep, query = location.partition("?") if is_uri(location) else (location, "", "")
    return "/".join([base.rstrip("/"), *parts]) + sep + query


def machine_cache() -> Path:
    """This machine's own loopstudy files (datasets, and an object-store study's Optuna journal and tracking runs):
    $LOOPSTUDY_CACHE, else ~/.cache/loopstudy; the temporary folder when HOME is missing or not a folder (a
    cluster's service account, a container), so nothing fails for want of a home."""
    if os.environ.get("LOOPSTUDY_CACHE"):
        return Path(os.environ["LOOPSTUDY_CACHE"])
    try:
        home = Path.home()
    except (RuntimeError, KeyError):
        home = None
    base = home / ".cache" if home is not None and home.is_dir() else Path(tempfile.gettempdir())
    return base / "loopstudy"


def resolve_root(root: str | os.PathLike) -> str:
    """A results root as every command and trial sees it: an object-store URI as given, a path made absolute
    (trials run in other working folders)."""
    root = str(root)
    return root if is_uri(root) else os.path.abspath(root)
