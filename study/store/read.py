"""Reading a table: which files are sources (listing, integrity, a running compaction) and the lazy Polars scan.

Read precedence: a trial's own file over the study's compacted rows, so a trial re-run after compaction (or one
read mid-compaction) counts once.
"""

from __future__ import annotations

import json

import pyarrow as pa

from study.store.files import Root
from study.store.integrity import STRAY, check_file
from study.store.layout import compacting_marker, file_trial_id, study_of_dir
from study.store.listing import list_table, studies
from study.store.schema import StoreError, schema


def being_compacted(root: Root, study: str | None) -> dict[str, list[int]]:
    """{path: [size, mtime_ns]} of per-trial files that a compaction has merged and is removing."""
    out: dict[str, list[int]] = {}
    for s in [study] if study is not None else studies(root):
        text = root.get_text(compacting_marker(s))
        if text:
            out.update(json.loads(text))
    return out


def sources(root: Root, table: str, study: str | None, skip_bad: bool) -> tuple[list[str], list[str]]:
    """(trial files, compacted files) whose footers show them sound and of the table's schema. A bad file is a
    StoreError naming it, or with skip_bad is named on stderr and left out; a file of another trial than its
    name says is always left out (named)."""
    want = schema(table)
    trial_infos, compacted_infos = list_table(root, table, study)
    if compacted_infos:  # files a running compaction is about to remove: read their rows from its output
        doomed = being_compacted(root, study)
        trial_infos = [i for i in trial_infos if doomed.get(i.path) != [i.size, i.mtime_ns]]
    kept: dict[str, list[str]] = {"trial": [], "compacted": []}
    bad = {}
    for kind, infos in (("trial", trial_infos), ("compacted", compacted_infos)):
        for info in infos:
            why = check_file(root, table, info, want)
            if why is None:
                kept[kind].append(info.path)
            elif why.startswith(STRAY):
                root.warn(info.path, why[len(STRAY):])
            else:
                bad[info.path] = why
    if bad and not skip_bad:
        listing = "; ".join(f"{f}: {why}" for f, why in bad.items())
        raise StoreError(f"bad Parquet file(s) in {table}: {listing}. "
                         "Pass --skip-bad (skip_bad=True) to read the rest.")
    for f, why in bad.items():
        root.warn(f, why)
    return kept["trial"], kept["compacted"]


def scan(root: Root, table: str, study: str | None = None, skip_bad: bool = False):
    """The table as a Polars LazyFrame with a `study` column (Hive partition): projections and filters reach the
    Parquet scan, nothing is read until collect()."""
    import polars as pl

    sch = pl.from_arrow(schema(table).empty_table()).schema
    trial, compacted = sources(root, table, study, skip_bad)
    opts = {"schema": sch, "missing_columns": "insert", "extra_columns": "ignore", "hive_partitioning": True,
            "hive_schema": {"study": pl.String}, "storage_options": root.polars_options()}
    frames = []
    if trial:
        frames.append(pl.scan_parquet([root.polars_path(f) for f in trial], **opts))
    if compacted:
        comp = pl.scan_parquet([root.polars_path(f) for f in compacted], **opts)
        own = [f"{study_of_dir(p.rsplit('/', 2)[-2])}/{file_trial_id(p)}" for p in trial]
        if own:
            comp = comp.filter(~pl.concat_str([pl.col("study"), pl.col("trial_id")], separator="/").is_in(own))
        frames.append(comp)
    if not frames:
        return pl.LazyFrame(schema={**sch, "study": pl.String})
    return pl.concat(frames, how="vertical") if len(frames) > 1 else frames[0]


def read(root: Root, table: str, study: str | None = None, skip_bad: bool = False) -> pa.Table:
    """All rows of `table` (one study or all), with a `study` column, under the table's current schema."""
    import polars as pl

    full = schema(table).append(pa.field("study", pa.string()))
    try:
        return scan(root, table, study, skip_bad).collect().to_arrow().cast(full)
    except (pl.exceptions.PolarsError, OSError) as err:  # damage past the footer
        raise StoreError(f"reading table {table} from {root.uri}: {err}") from None
