"""Compaction: a study's complete trials merged into one `study.compacted.parquet` per table, safely under readers.

Every table's compacted file is written (atomically) before any per-trial file is removed, and readers prefer a
trial's own file over compacted rows, so reads are right before, during and after, and a crash at any point loses
nothing. Per-trial files of trials not yet complete stay. A per-trial file that changed after it was read (a trial
re-running) is not removed. Per-trial files go grace_s after the compacted files are in place: a read that listed
them just before can still open them (one that lists and then waits longer fails with file-not-found; it is never
wrong). An earlier store's `_compacted.parquet` is read once more and replaced.

A trial that runs again after it was compacted first takes its rows out of the compacted files (evict), so its
rows are in one place at rest, for loopstudy and for any plain Parquet reader alike.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from study.store.completeness import compacted_ids, completed_trials
from study.store.files import Root
from study.store.layout import LEGACY_COMPACTED, compacted_file, compacting_marker, file_trial_id
from study.store.listing import compacted_path, list_table
from study.store.scan import scan, sources
from study.store.schema import TABLES, schema


def compact(root: Root, study: str, on_table: Callable[[str, int, int], None] | None = None,
            grace_s: float = 5.0) -> dict[str, int]:
    """Merge the study's complete trials; returns counts. on_table(table, trial_files_merged, rows) reports
    progress."""
    import polars as pl

    done = completed_trials(root, study)
    compacted = compacted_ids(root, study)
    for table in TABLES:  # a trial with a file the footer check refuses (named) stays out, files and all
        done &= {file_trial_id(p) for p in sources(root, table, study, True)[0]} | compacted
    listed = {t: {i.path: (i.size, i.mtime_ns) for i in list_table(root, t, study)[0]} for t in TABLES}
    merged = {t: [p for p in listed[t] if file_trial_id(p) in done] for t in TABLES}
    rows = {}
    for table in TABLES:
        df = (scan(root, table, study, skip_bad=True).filter(pl.col("trial_id").is_in(sorted(done)))
              .drop("study").sort("trial_id").collect())
        data = df.to_arrow().cast(schema(table))
        root.write_table(data, compacted_file(root.root, table, study))
        rows[table] = data.num_rows
        if on_table:
            on_table(table, len(merged[table]), data.num_rows)
    # Say which files are about to go before any goes: a read that lists files from now on leaves them out
    # (their rows are in the compacted files), one that listed them earlier has grace_s to open them.
    doomed = {p: listed[t][p] for t in TABLES for p in merged[t]}
    marker = compacting_marker(study)
    root.put_text(marker, json.dumps({p: [size, mtime] for p, (size, mtime) in doomed.items()}))
    time.sleep(grace_s if doomed else 0)
    removed = 0
    for path, stamp in doomed.items():
        info = root.fs.get_file_info(path)
        if info.type == pafs.FileType.File and (info.size, info.mtime_ns) == tuple(stamp):
            root.fs.delete_file(path)
            removed += 1
    _remove_legacy(root, study)  # reads have passed over them since the new files were in place
    root.fs.delete_file(f"{root.root}/{marker}")
    return {"trials": len(done), "files_removed": removed, **{f"{t}_rows": n for t, n in rows.items()}}


def evict(root: Root, study: str, trial_id: str) -> bool:
    """Take one trial's rows out of the study's compacted files, because it is about to be written again; returns
    whether it was there. The trials table goes first: from then on the trial is not complete. Each file is
    rewritten atomically; two evictions in one study at the same moment could undo one another's (the rows then
    count once for loopstudy, whose reads prefer a trial's own file, and twice for plain readers until the next
    compaction): re-running a compacted trial is a deliberate `loopstudy trial --study`, not something a study
    does."""
    if trial_id not in compacted_ids(root, study, trial_id):
        return False
    for table in TABLES:
        path = compacted_path(root, table, study)
        if path is None:
            continue
        with root.fs.open_input_file(path) as fh:
            data = pq.read_table(fh)
        kept = data.filter(pc.not_equal(data["trial_id"], trial_id))
        root.write_table(kept.cast(schema(table)), compacted_file(root.root, table, study))
    _remove_legacy(root, study)
    return True


def _remove_legacy(root: Root, study: str) -> None:
    for table in TABLES:
        path = compacted_file(root.root, table, study, LEGACY_COMPACTED)
        if root.kind(path) == pafs.FileType.File:
            root.fs.delete_file(path)
