"""Reading a table: which files are sources (listing, integrity, a running compaction) and the lazy Polars scan.

Read precedence: a trial's own file over the study's compacted rows, so a trial re-run after compaction (or one
read mid-compaction) counts once.
"""

from __future__ import annotations

import json

import pyarrow as pa

from study.errors import StoreError
from study.store.files import Root
from study.store.integrity import STRAY, check_file, extra_config_fields
from study.store.layout import compacting_marker, file_trial_id, study_of_dir
from study.store.listing import list_table, studies
from study.store.schema import schema


def being_compacted(root: Root, study: str | None) -> dict[str, list[int]]:
    """{path: [size, mtime_ns]} of per-trial files that a compaction has merged and is removing."""
    out: dict[str, list[int]] = {}
    for s in [study] if study is not None else studies(root):
        try:
            text = root.get_text(compacting_marker(s))
            doomed = json.loads(text) if text else {}
            if not isinstance(doomed, dict):
                raise ValueError("not a mapping")
        except (StoreError, ValueError):
            # a damaged marker names nothing reliably: read every file still there (each trial's own file wins)
            root.warn(f"{root.root}/{compacting_marker(s)}", "a damaged compaction marker; ignored")
            continue
        out.update(doomed)
    return out


def sources(root: Root, table: str, study: str | None, skip_bad: bool) -> tuple[list[str], list[str], pa.Schema]:
    """(trial files, compacted files, the schema to read them with) for the files whose footers show them sound
    and of the table's schema. The schema is the table's, plus the config columns the files hold that the installed
    config does not declare (an uninstalled plugin's settings), so that what a study swept reads the same whatever
    is installed. A bad file is a StoreError naming it, or with skip_bad is named on stderr and left out; a file of
    another trial than its name says is always left out (named)."""
    want = schema(table)
    trial_infos, compacted_infos = list_table(root, table, study)
    if compacted_infos:  # files a running compaction is about to remove: read their rows from its output
        doomed = being_compacted(root, study)
        trial_infos = [i for i in trial_infos if doomed.get(i.path) != [i.size, i.mtime_ns]]
    kept: dict[str, list[str]] = {"trial": [], "compacted": []}
    bad = {}
    extras: dict[str, pa.Field] = {}
    for kind, infos in (("trial", trial_infos), ("compacted", compacted_infos)):
        for info in infos:
            why = check_file(root, table, info, want)
            if why is None:
                kept[kind].append(info.path)
                for f in extra_config_fields(root, table, info):
                    extras.setdefault(f.name, f)
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
    return kept["trial"], kept["compacted"], pa.schema([*want, *(extras[n] for n in sorted(extras))])


def study_of_file(path: str) -> str:
    """The study a listed file belongs to: the name of its `study=<name>` folder."""
    return study_of_dir(path.rsplit("/", 2)[-2])


def scan(root: Root, table: str, study: str | None = None, skip_bad: bool = False):
    """The table as a Polars LazyFrame with a `study` column: projections and filters reach the Parquet scan,
    nothing is read until collect().

    Every path is literal: files are read as listed (no glob expansion, so a root named `g[1]` or `g*` reads its
    own files only), and the study comes from the listing, not from parsing `key=value` out of the path (a root
    or folder with `=` in its name is not a Hive partition)."""
    import polars as pl

    trial, compacted, arrow_schema = sources(root, table, study, skip_bad)
    # (not Schema.empty_table(), which imports pandas: half a second of every reading command's start)
    sch = pl.from_arrow(pa.Table.from_batches([], schema=arrow_schema)).schema
    opts = {"schema": sch, "missing_columns": "insert", "extra_columns": "ignore", "hive_partitioning": False,
            "glob": False, "storage_options": root.polars_options()}

    def per_study(files: list[str]) -> dict[str, pl.LazyFrame]:
        by: dict[str, list[str]] = {}
        for f in files:
            by.setdefault(study_of_file(f), []).append(root.polars_path(f))
        return {s: pl.scan_parquet(paths, **opts).with_columns(pl.lit(s, pl.String).alias("study"))
                for s, paths in by.items()}

    frames = list(per_study(trial).values())
    own: dict[str, list[str]] = {}
    for f in trial:
        own.setdefault(study_of_file(f), []).append(file_trial_id(f))
    for s, comp in per_study(compacted).items():  # a trial's own file wins over its compacted rows
        frames.append(comp.filter(~pl.col("trial_id").is_in(own[s])) if s in own else comp)
    if not frames:
        return pl.LazyFrame(schema={**sch, "study": pl.String})
    return pl.concat(frames, how="vertical") if len(frames) > 1 else frames[0]


def read(root: Root, table: str, study: str | None = None, skip_bad: bool = False) -> pa.Table:
    """All rows of `table` (one study or all), with a `study` column, under the table's current schema."""
    import polars as pl

    try:
        df = scan(root, table, study, skip_bad).collect()
        # the table's schema, plus the config columns only the files hold (see sources), in the scan's order
        full = schema(table).append(pa.field("study", pa.string()))
        full = pa.schema([*full, *(f for f in df.to_arrow().schema if full.get_field_index(f.name) < 0)])
        return df.select(full.names).to_arrow().cast(full)
    except (pl.exceptions.PolarsError, OSError) as err:  # damage past the footer
        raise StoreError(f"reading table {table} from {root.uri}: {err}") from None
