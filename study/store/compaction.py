"""Compaction: a study's complete trials merged into one `_compacted.parquet` per table, safely under readers.

Every table's compacted file is written (atomically) before any per-trial file is removed, and readers prefer a
trial's own file over compacted rows, so reads are right before, during and after, and a crash at any point loses
nothing. Per-trial files of trials not yet complete stay. A per-trial file that changed after it was read (a trial
re-running) is not removed. Per-trial files go grace_s after the compacted files are in place: a read that listed
them just before can still open them (one that lists and then waits longer fails with file-not-found; it is never
wrong).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pyarrow.fs as pafs

from study.store.completeness import compacted_ids, completed_trials
from study.store.files import Root
from study.store.layout import compacted_file, compacting_marker, file_trial_id
from study.store.listing import list_table
from study.store.read import scan, sources
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
    root.fs.delete_file(f"{root.root}/{marker}")
    return {"trials": len(done), "files_removed": removed, **{f"{t}_rows": n for t, n in rows.items()}}
