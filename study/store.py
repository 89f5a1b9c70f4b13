"""The results store: one Parquet file per trial per table, Hive-partitioned by study (design.md, results store).

    <root>/<table>/study=<name>/<trial_id>.parquet

Local paths, NFS paths and object stores (s3://bucket/prefix, gs://...) go through pyarrow.fs. Writes are atomic:
on a file system a temporary dot-file is renamed into place; on an object store the file is one PUT. A retried
trial replaces its own file, so nothing is counted twice. Reads use each table's explicit schema, so files written
under an older schema version (fewer columns) still load, with nulls in the new columns. Torch-free.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
import types
import typing
import uuid
from datetime import UTC, datetime
from typing import Any, Literal

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from study.config import STUDY_NAME, TrialConfig, check_study_name

SCHEMA_VERSION = 1
STRAY = "stray: "  # marks a _check_file verdict that leaves the file out always (not a trial's own file)
TRIAL_FILE = re.compile(r"[A-Za-z0-9_-]+\.parquet")  # <trial_id>.parquet: what a trial writes, nothing else

_KEY = [pa.field("trial_id", pa.string()), pa.field("schema_version", pa.int32())]

SCHEMAS: dict[str, pa.Schema] = {
    "train_curve": pa.schema(_KEY + [
        pa.field("step", pa.int64()), pa.field("loss", pa.float64()), pa.field("cell_acc", pa.float64()),
        pa.field("exact_acc", pa.float64()), pa.field("lr", pa.float64()), pa.field("seconds", pa.float64()),
    ]),
    "depth_eval": pa.schema(_KEY + [
        pa.field("depth_layers", pa.int64()), pa.field("outer_cycles", pa.int64()),
        pa.field("difficulty", pa.int64()), pa.field("n", pa.int64()), pa.field("exact_acc", pa.float64()),
        pa.field("cell_acc", pa.float64()), pa.field("halted_frac", pa.float64()),
        pa.field("eff_layers", pa.float64()),
    ]),
    "dynamics": pa.schema(_KEY + [
        pa.field("kind", pa.string()), pa.field("axis", pa.string()), pa.field("update", pa.int64()),
        pa.field("from_update", pa.int64()), pa.field("offset", pa.int64()), pa.field("wrong_cells", pa.float64()),
        *[pa.field(n, pa.float64()) for n in (
            "gamma_mean", "gamma_p10", "gamma_p90", "score_median", "score_p25", "score_p75", "changed",
            "wrong_delta", "flipped", "solved", "lost", "residual_mean", "eta_mean")],
        pa.field("n", pa.int64()),
    ]),
    "perturbation": pa.schema(_KEY + [
        pa.field("eps", pa.float64()), pa.field("update", pa.int64()), pa.field("updates_after", pa.int64()),
        pa.field("n_solved", pa.int64()), pa.field("solved_kept", pa.float64()),
        pa.field("rel_distance", pa.float64()),
    ]),
}

TRIAL_FIELDS = [
    pa.field("status", pa.string()), pa.field("params", pa.int64()),
    pa.field("started", pa.timestamp("ms", tz="UTC")), pa.field("ended", pa.timestamp("ms", tz="UTC")),
    pa.field("wall_s", pa.float64()), pa.field("device", pa.string()), pa.field("package_version", pa.string()),
    pa.field("git_commit", pa.string()), pa.field("node", pa.string()), pa.field("final_exact_acc", pa.float64()),
    pa.field("best_exact_acc", pa.float64()), pa.field("final_train_loss", pa.float64()),
]


def _arrow_type(tp: Any) -> pa.DataType | None:
    """Arrow type of a config field's annotation; None for a nested config (flattened instead)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _arrow_type(args[0]) if len(args) == 1 else pa.string()
    if origin is Literal:
        return pa.string()
    if origin in (tuple, list) or tp in (tuple, list):
        return pa.string()  # stored as JSON text
    return {bool: pa.bool_(), int: pa.int64(), float: pa.float64(), str: pa.string()}.get(tp, pa.string())


def config_fields(cls: type = TrialConfig, prefix: str = "") -> list[pa.Field]:
    """One column per leaf of the trial config, named by its dotted key ('model.carry.beta_init')."""
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            out += config_fields(tp, f"{prefix}{f.name}.")
        else:
            out.append(pa.field(f"{prefix}{f.name}", _arrow_type(tp)))
    return out


def trials_schema() -> pa.Schema:
    return pa.schema(_KEY + TRIAL_FIELDS + config_fields())


def schema(table: str) -> pa.Schema:
    if table == "trials":
        return trials_schema()
    if table not in SCHEMAS:
        raise StoreError(f"unknown table {table!r}; tables: {', '.join(TABLES)}")
    return SCHEMAS[table]


TABLES = ("trials", *SCHEMAS)


def config_row(cfg_dict: dict[str, Any]) -> dict[str, Any]:
    """Flatten a trial config dict to its dotted columns; lists and tuples become JSON text."""
    from study.config import flatten

    return {k: json.dumps(v) if isinstance(v, list | tuple) else v for k, v in flatten(cfg_dict).items()}


class StoreError(Exception):
    """A problem reading or writing the results store; the message says what and where."""


class Store:
    """Results under a root: a local/NFS path or an object-store URI (s3://bucket/prefix?endpoint_override=...)."""

    def __init__(self, root: str | os.PathLike):
        root = str(root)
        if "://" in root:
            try:
                self.fs, path = pafs.FileSystem.from_uri(root)
            except (pa.ArrowException, ValueError) as e:
                raise StoreError(f"results store {root}: {e}") from None
            self.local = isinstance(self.fs, pafs.LocalFileSystem)
        else:
            self.fs, path, self.local = pafs.LocalFileSystem(), os.path.abspath(root), True
        self.uri = root
        self.root = path.rstrip("/")
        self._warned: set[str] = set()
        if self.fs.get_file_info(self.root).type == pafs.FileType.File:
            raise StoreError(f"results store {root} is a file; give a folder (it is created if missing) or "
                             "an object-store URI such as s3://bucket/prefix")

    def exists(self) -> bool:
        """Whether the root is there (a store that was never written to is not)."""
        return self.fs.get_file_info(self.root).type == pafs.FileType.Directory

    def require(self) -> Store:
        """self, or StoreError when the root does not exist (reading commands: say so rather than show 0 rows)."""
        if not self.exists():
            raise StoreError(f"no results store at {self.uri}: nothing has been written there (check --store)")
        return self

    def __repr__(self) -> str:
        return f"Store({self.uri!r})"

    def _dir(self, table: str, study: str) -> str:
        return f"{self.root}/{table}/study={check_study_name(study)}"

    # -- writing ---------------------------------------------------------------------------------------------------
    def write(self, table: str, study: str, trial_id: str, rows: list[dict[str, Any]]) -> str:
        """Write (or replace) one trial's rows of one table; returns the file path."""
        sch = schema(table)
        if not TRIAL_FILE.fullmatch(f"{trial_id}.parquet"):
            raise StoreError(f"trial id {trial_id!r} is not allowed: letters, digits, '_' and '-' only")
        names = set(sch.names)
        unknown = sorted({k for r in rows for k in r} - names - {"study"})
        if unknown:
            raise StoreError(f"table {table}: columns {unknown} are not in its schema")
        full = [{**{n: None for n in sch.names}, **r, "trial_id": trial_id, "schema_version": SCHEMA_VERSION}
                for r in rows]
        for r in full:
            r.pop("study", None)
        data = pa.Table.from_pylist(full, schema=sch)
        d = self._dir(table, study)
        self.fs.create_dir(d, recursive=True)
        final = f"{d}/{trial_id}.parquet"
        if self.local:
            tmp = f"{d}/.{trial_id}.parquet.{uuid.uuid4().hex[:8]}.tmp"
            try:
                pq.write_table(data, tmp, filesystem=self.fs)
                self.fs.move(tmp, final)  # rename: readers see the old file or the new one, never half of one
            finally:
                if self.fs.get_file_info(tmp).type != pafs.FileType.NotFound:
                    self.fs.delete_file(tmp)
        else:
            pq.write_table(data, final, filesystem=self.fs)  # small file: a single PUT, visible only when complete
        return final

    # -- reading ---------------------------------------------------------------------------------------------------
    def studies(self) -> list[str]:
        """Studies with at least one file in any table (folders whose name breaks the study-name rule are not)."""
        found: set[str] = set()
        for table in TABLES:
            base = f"{self.root}/{table}"
            for info in self.fs.get_file_info(pafs.FileSelector(base, allow_not_found=True)):
                name = info.base_name[len("study="):]
                if info.type == pafs.FileType.Directory and info.base_name.startswith("study=") and \
                        STUDY_NAME.fullmatch(name) and ".." not in name:
                    found.add(name)
        return sorted(found)

    def _warn(self, path: str, why: str) -> None:
        if path not in self._warned:  # once per file and Store, however many tables a command reads
            self._warned.add(path)
            print(f"loopstudy: left out {path}: {why}", file=sys.stderr)

    def files(self, table: str, study: str | None = None) -> list[str]:
        """The table's trial files, `<table>/study=<name>/<trial_id>.parquet`, one study or all.

        Anything else under the table (a stray copy such as `<id> (1).parquet`, a `backup/` folder, a folder whose
        name breaks the study-name rule) would count a trial twice: it is named on stderr and left out. Dot- and
        underscore-files (writes in flight) are passed over silently.
        """
        schema(table)  # validates the table name
        base = f"{self.root}/{table}" + (f"/study={check_study_name(study)}" if study is not None else "")
        out = []
        for info in self.fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True)):
            if info.type != pafs.FileType.File or info.base_name.startswith((".", "_")):
                continue
            parts = info.path[len(self.root) + len(table) + 2:].split("/")
            name = parts[0][len("study="):] if parts[0].startswith("study=") else ""
            if len(parts) == 2 and STUDY_NAME.fullmatch(name) and ".." not in name and \
                    TRIAL_FILE.fullmatch(parts[1]):
                out.append(info.path)
            else:
                self._warn(info.path, "not a trial file (<table>/study=<name>/<trial_id>.parquet)")
        return sorted(out)

    def _check_file(self, table: str, path: str, want: pa.Schema) -> str | None:
        """Why the file cannot be read as part of `table` (None when it can), from its footer alone: unreadable,
        a column of the wrong type, or rows of another trial than its name says (a renamed copy)."""
        try:
            with self.fs.open_input_file(path) as fh:
                meta = pq.read_metadata(fh)
            got = meta.schema.to_arrow_schema()
        except (pa.ArrowException, OSError) as e:
            return f"unreadable Parquet ({str(e).splitlines()[0]})"
        for f in got:
            i = want.get_field_index(f.name)
            if i >= 0 and not f.type.equals(want.field(i).type):
                return f"column {f.name!r} is {f.type}, the {table} table's schema says {want.field(i).type}"
        stem = path.rsplit("/", 1)[-1][:-len(".parquet")]
        col = got.get_field_index("trial_id")
        if col < 0:
            return "no trial_id column"
        for g in range(meta.num_row_groups):
            stats = meta.row_group(g).column(col).statistics
            if stats is not None and stats.has_min_max and (stats.min, stats.max) != (stem, stem):
                return f"{STRAY}its rows belong to trial {stats.min!r}, not {stem!r} (a renamed copy?)"
        return None

    def valid_files(self, table: str, study: str | None = None, skip_bad: bool = False) -> list[str]:
        """files() less those whose footer shows them corrupt or of another schema: StoreError naming them, or with
        skip_bad each named on stderr and left out."""
        want = schema(table)
        kept, bad = [], {}
        for f in self.files(table, study):
            why = self._check_file(table, f, want)
            if why is None:
                kept.append(f)
            elif why.startswith(STRAY):  # not a trial's own file: always left out, like a stray name
                self._warn(f, why[len(STRAY):])
            else:
                bad[f] = why
                kept.append(f)
        return self._without_bad(table, kept, bad, skip_bad)

    def _without_bad(self, table: str, files: list[str], bad: dict[str, str], skip_bad: bool) -> list[str]:
        if bad and not skip_bad:
            listing = "; ".join(f"{f}: {why}" for f, why in bad.items())
            raise StoreError(f"bad Parquet file(s) in {table}: {listing}. "
                             "Pass --skip-bad (skip_bad=True) to read the rest.")
        for f, why in bad.items():
            self._warn(f, why)
        return [f for f in files if f not in bad]

    def _read_error(self, path: str) -> str | None:
        try:
            with self.fs.open_input_file(path) as fh:
                pq.ParquetFile(fh).read()
        except (pa.ArrowException, OSError) as e:
            return f"unreadable Parquet ({str(e).splitlines()[0]})"
        return None

    def read(self, table: str, study: str | None = None, skip_bad: bool = False) -> pa.Table:
        """All rows of `table` (one study or all), with a `study` column, under the table's current schema."""
        sch = schema(table)
        files = self.valid_files(table, study, skip_bad)
        full_schema = sch.append(pa.field("study", pa.string()))
        if not files:
            return full_schema.empty_table()
        part = pads.partitioning(pa.schema([("study", pa.string())]), flavor="hive")

        def load(fs_list: list[str]) -> pa.Table:
            return pads.dataset(fs_list, schema=full_schema, format="parquet", filesystem=self.fs, partitioning=part,
                                partition_base_dir=f"{self.root}/{table}").to_table()

        try:
            return load(files)
        except (pa.ArrowException, OSError) as err:  # damage past the footer: find the file(s) by reading each
            bad = {f: why for f in files if (why := self._read_error(f))}
            if not bad:
                raise StoreError(f"reading table {table} from {self.uri}: {err}") from None
            good = self._without_bad(table, files, bad, skip_bad)
            return load(good) if good else full_schema.empty_table()

    def scan(self, table: str, study: str | None = None, skip_bad: bool = False):
        """The table as a Polars LazyFrame with a `study` column; projections and filters reach the Parquet scan.

        Local stores are scanned by Polars' own reader over the checked trial files (Hive partition `study`);
        object stores go through pyarrow.fs (read()).
        """
        import polars as pl

        if not self.local:
            # one chunk per file would make the conversion crawl over many tiny chunks: combine them first
            return pl.from_arrow(self.read(table, study, skip_bad).combine_chunks()).lazy()
        sch = pl.from_arrow(schema(table).empty_table()).schema
        files = self.valid_files(table, study, skip_bad)
        if not files:
            return pl.LazyFrame(schema={**sch, "study": pl.String})
        return pl.scan_parquet(files, schema=sch, missing_columns="insert", extra_columns="ignore",
                               hive_partitioning=True, hive_schema={"study": pl.String})

    def put_text(self, rel: str, text: str) -> None:
        """A small text file under the root (e.g. _studies/<name>.yaml); readers of tables ignore '_' dirs."""
        path = f"{self.root}/{rel}"
        self.fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        with self.fs.open_output_stream(path) as f:
            f.write(text.encode())

    def get_text(self, rel: str) -> str | None:
        path = f"{self.root}/{rel}"
        if self.fs.get_file_info(path).type != pafs.FileType.File:
            return None
        with self.fs.open_input_stream(path) as f:
            return f.read().decode()

    def trial_row(self, study: str, trial_id: str) -> dict[str, Any] | None:
        """One trial's row of the trials table, from its own file alone (None when it has no sound file)."""
        path = f"{self._dir('trials', study)}/{trial_id}.parquet"
        if self.fs.get_file_info(path).type != pafs.FileType.File or self._check_file("trials", path, trials_schema()):
            return None
        with self.fs.open_input_file(path) as fh:
            rows = pq.read_table(fh).to_pylist()
        return rows[0] if rows else None

    def is_complete(self, study: str, trial_id: str) -> bool:
        """Whether one trial's results are complete, from its own files alone: the cost does not grow with the
        study. Same rule as completed_trials."""
        row = self.trial_row(study, trial_id)
        if row is None or row.get("status") != "complete":
            return False
        for table in SCHEMAS:
            path = f"{self._dir(table, study)}/{trial_id}.parquet"
            if self.fs.get_file_info(path).type != pafs.FileType.File or self._check_file(table, path, schema(table)):
                return False
        return True

    def completed_trials(self, study: str) -> set[str]:
        """Trial ids whose results are complete: the trials row (written last) says status=complete and every other
        table holds a sound file for the trial, so a trial with a corrupt or missing file runs again."""
        import polars as pl

        done = set(self.scan("trials", study, skip_bad=True).filter(pl.col("status") == "complete")
                   .select("trial_id").collect()["trial_id"].to_list())
        for table in SCHEMAS:
            files = self.valid_files(table, study, skip_bad=True)
            done &= {f.rsplit("/", 1)[-1][:-len(".parquet")] for f in files}
        return done


def now_utc() -> datetime:
    return datetime.now(UTC)
