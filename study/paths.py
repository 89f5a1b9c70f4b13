"""What a location string is: an object-store URI (s3://bucket/prefix, gs://...) or a path on this machine.

One rule, used by the store, the data-file paths and the launcher's storage checks.
"""

from __future__ import annotations

import os


def is_uri(location: str) -> bool:
    """Whether `location` names an object store (scheme://...) rather than a local or NFS path."""
    return "://" in location


def join(location: str, *parts: str) -> str:
    """`location/part/...` for a path or a URI: a URI's query (`?endpoint_override=...&scheme=http`) stays at the
    end, where pyarrow and Tune read it (appended after it, a path part would become part of the query)."""
    base, sep, query = location.partition("?") if is_uri(location) else (location, "", "")
    return "/".join([base.rstrip("/"), *parts]) + sep + query


def resolve_root(root: str | os.PathLike) -> str:
    """A results root as every command and trial sees it: an object-store URI as given, a path made absolute
    (trials run in other working folders)."""
    root = str(root)
    return root if is_uri(root) else os.path.abspath(root)
