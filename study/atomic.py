"""Atomic file writes, the one way loopstudy writes a file that others may read at the same moment.

On a file system the content goes to a temporary dot-file beside the target, which is renamed into place: a
reader sees the old file or the new one, never half of one, and a crash leaves at most a dot-file that every
listing passes over. On an object store the write is a single PUT, visible only when complete.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import pyarrow.fs as pafs


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
