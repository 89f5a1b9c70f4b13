"""What complete means: a trial's `trials` file (written last, only when the trial completed) and a sound file in
every other table, or a place in the study's compacted files. A trial with a corrupt or missing file is not
complete, so running the study again repairs it."""

from __future__ import annotations

from typing import Any

import pyarrow.fs as pafs
import pyarrow.parquet as pq

from study.store.files import Root
from study.store.integrity import check_file, sound
from study.store.layout import trial_file
from study.store.listing import compacted_path, sound_trial_ids
from study.store.scan import scan
from study.store.schema import TABLES, schema, trials_schema


def compacted_ids(root: Root, study: str, trial_id: str | None = None) -> set[str]:
    """Trials held by the study's compacted files (one trial's id, or all): compaction moves only complete
    trials, every table at once, so the compacted trials table is their record; every table's compacted
    file must be sound for it to count."""
    import polars as pl

    paths = {table: compacted_path(root, table, study) for table in TABLES}
    for table, path in paths.items():
        info = root.fs.get_file_info(path) if path else None
        if info is None or not sound(root, info) or check_file(root, table, info, schema(table)):
            return set()
    path = paths["trials"]
    lf = pl.scan_parquet(root.polars_path(path), storage_options=root.polars_options(), glob=False,
                         hive_partitioning=False).select("trial_id")
    if trial_id is not None:
        lf = lf.filter(pl.col("trial_id") == trial_id)
    return set(lf.collect()["trial_id"].to_list())


def completed_trials(root: Root, study: str) -> set[str]:
    """Trial ids whose results are complete. Listings and one small read per file's last bytes: no Parquet is
    parsed, so 10,000 trials take a fraction of a second."""
    done: set[str] | None = None
    for table in TABLES:
        ids = sound_trial_ids(root, table, study)
        done = ids if done is None else done & ids
    return done | compacted_ids(root, study)


def is_complete(root: Root, study: str, trial_id: str) -> bool:
    """One trial's completeness from its own files (or one filtered read of the compacted trials file): the cost
    does not grow with the number of trial files. Same rule as completed_trials."""
    infos = root.fs.get_file_info([trial_file(root.root, t, study, trial_id) for t in TABLES])
    if all(i.type == pafs.FileType.File and sound(root, i) for i in infos):
        return not any(check_file(root, t, i, schema(t)) for t, i in zip(TABLES, infos))
    return trial_id in compacted_ids(root, study, trial_id)


def trial_row(root: Root, study: str, trial_id: str) -> dict[str, Any] | None:
    """One trial's row of the trials table, from its own file (or the compacted file); None when it has none."""
    import polars as pl

    info = root.fs.get_file_info(trial_file(root.root, "trials", study, trial_id))
    if info.type == pafs.FileType.File and not check_file(root, "trials", info, trials_schema()):
        with root.fs.open_input_file(info.path) as fh:
            rows = pq.read_table(fh).to_pylist()
        return rows[0] if rows else None
    if trial_id not in compacted_ids(root, study, trial_id):
        return None
    df = scan(root, "trials", study, skip_bad=True).filter(pl.col("trial_id") == trial_id).collect()
    return df.row(0, named=True) if df.height else None
