"""Paths and files: what a location string is (an object-store URI such as s3://bucket/prefix, or a
path on this machine), this machine's cache folder, and atomic writes, the one way loopstudy writes a file that
others may read at the same moment.

Atomic writes: on a file system the content goes to a temporary dot-file beside the target, which is renamed into
place: a reader sees the old file or the new one, never half of one, and a crash leaves at most a dot-file that
every listing passes over. On an object store the write is a single PUT, visible only when complete.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow.fs as pafs


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



@contextlib.contextmanager
def atomic_target(final: str, fs: pafs.FileSystem | None = None) -> Iterator[str]:
    """Yield the path to write `final`'s content to; on leaving the block it becomes `final` (or, after an error,
    is removed). fs: a pyarrow file system (default: this machine's)."""
    fs = fs or pafs.LocalFileSystem()
    folder, name = final.rsplit("/", 1) if "/" in final else (".", final)
    fs.create_dir(folder, recursive=True)
    if not isinstance(fs, pafs.LocalFileSystem) and not _is_local_subtree(fs):
        yield final  # object store: one PUT
        return
    tmp = f"{folder}/.{name}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        yield tmp
        fs.move(tmp, final)
    finally:
        if fs.get_file_info(tmp).type != pafs.FileType.NotFound:
            fs.delete_file(tmp)


def _is_local_subtree(fs: pafs.FileSystem) -> bool:
    return isinstance(fs, pafs.SubTreeFileSystem) and isinstance(fs.base_fs, pafs.LocalFileSystem)


def write_bytes(final: str, data: bytes, fs: pafs.FileSystem | None = None) -> None:
    """`data` as the whole content of `final`, atomically."""
    fs = fs or pafs.LocalFileSystem()
    with atomic_target(final, fs) as tmp, fs.open_output_stream(tmp) as out:
        out.write(data)
