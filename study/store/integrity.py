"""Whether a file may be read as a trial's rows: a cheap whole-file check (the Parquet magic at its end) and a
footer check (readable, the table's column types, rows of the trial its name says). The footer also says which
config columns the file holds beyond the installed config's (a plugin's settings, read without the plugin)."""

from __future__ import annotations

import os
import stat

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from study.store.files import Entry, Root
from study.store.layout import COMPACTED_NAMES, file_trial_id

STRAY = "stray: "  # marks a verdict that leaves the file out always (not a trial's own file)


def has_parquet_tail(path: str) -> bool:
    """Whether a local path is a regular file (not a link, folder or FIFO: see listing.py) that ends the way every
    complete Parquet file does (footer, then the magic 'PAR1'): a truncated or overwritten file does not. One open,
    a seek and a 4-byte read (~8 us), no parsing: the driver checks 50,000 files of a 10,000-trial study this way
    in about 0.4 s. Opened without blocking and without following links, so a FIFO can never hang a command."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        size = os.lseek(fd, 0, os.SEEK_END)
        return size >= 12 and os.pread(fd, 4, size - 4) == b"PAR1"
    finally:
        os.close(fd)


def sound(root: Root, info: Entry | pafs.FileInfo) -> bool:
    """Cheap whole-file check without parsing (see has_parquet_tail). Local files only: a read per object would
    cost a request each, and object-store writes are single PUTs, never half a file."""
    if info.size is None or info.size < 12:
        return False
    return has_parquet_tail(info.path) if root.local else True


def check_file(root: Root, table: str, info: Entry | pafs.FileInfo, want: pa.Schema) -> str | None:
    """Why the file cannot be read as part of `table` (None when it can), from its footer alone: unreadable,
    a column of the wrong type, or (a trial file) rows of another trial than its name says. Remembered per
    file version (size, mtime) for this Store, since one command scans a table many times."""
    key = (table, info.path, info.size, info.mtime_ns)
    if key not in root.verdicts:
        root.verdicts[key] = _footer_verdict(root, table, info.path, want, key)
    return root.verdicts[key]


def extra_config_fields(root: Root, table: str, info: Entry | pafs.FileInfo) -> list[pa.Field]:
    """The config columns a checked file holds that the table's installed schema lacks (check_file first)."""
    return root.extras.get((table, info.path, info.size, info.mtime_ns), [])


CONFIG_SECTIONS = ("task", "model", "train", "eval")  # a trials row's config columns: <section>.<key>


def _footer_verdict(root: Root, table: str, path: str, want: pa.Schema, key: tuple) -> str | None:
    try:
        with root.fs.open_input_file(path) as fh:
            meta = pq.read_metadata(fh)
        got = meta.schema.to_arrow_schema()
    except (pa.ArrowException, OSError) as e:
        return f"unreadable Parquet ({str(e).splitlines()[0]})"
    root.extras[key] = [f for f in got if want.get_field_index(f.name) < 0
                        and f.name.split(".", 1)[0] in CONFIG_SECTIONS]
    for f in got:
        i = want.get_field_index(f.name)
        if i >= 0 and not f.type.equals(want.field(i).type):
            return f"column {f.name!r} is {f.type}, the {table} table's schema says {want.field(i).type}"
    col = got.get_field_index("trial_id")
    if col < 0:
        return "no trial_id column"
    stem = file_trial_id(path)
    if path.rsplit("/", 1)[-1] in COMPACTED_NAMES:
        return None
    for g in range(meta.num_row_groups):
        stats = meta.row_group(g).column(col).statistics
        if stats is not None and stats.has_min_max and (stats.min, stats.max) != (stem, stem):
            return f"{STRAY}its rows belong to trial {stats.min!r}, not {stem!r} (a renamed copy?)"
    return None
