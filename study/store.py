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

from study.config import TrialConfig

SCHEMA_VERSION = 1

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
            self.fs, path = pafs.FileSystem.from_uri(root)
            self.local = isinstance(self.fs, pafs.LocalFileSystem)
        else:
            self.fs, path, self.local = pafs.LocalFileSystem(), os.path.abspath(root), True
        self.uri = root
        self.root = path.rstrip("/")

    def __repr__(self) -> str:
        return f"Store({self.uri!r})"

    def _dir(self, table: str, study: str) -> str:
        return f"{self.root}/{table}/study={study}"

    # -- writing ---------------------------------------------------------------------------------------------------
    def write(self, table: str, study: str, trial_id: str, rows: list[dict[str, Any]]) -> str:
        """Write (or replace) one trial's rows of one table; returns the file path."""
        sch = schema(table)
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
        """Studies with at least one file in any table."""
        found: set[str] = set()
        for table in TABLES:
            base = f"{self.root}/{table}"
            if self.fs.get_file_info(base).type != pafs.FileType.Directory:
                continue
            for info in self.fs.get_file_info(pafs.FileSelector(base, allow_not_found=True)):
                if info.type == pafs.FileType.Directory and info.base_name.startswith("study="):
                    found.add(info.base_name[len("study="):])
        return sorted(found)

    def files(self, table: str, study: str | None = None) -> list[str]:
        schema(table)  # validates the name
        base = f"{self.root}/{table}" + (f"/study={study}" if study else "")
        sel = pafs.FileSelector(base, recursive=True, allow_not_found=True)
        out = [i.path for i in self.fs.get_file_info(sel)
               if i.type == pafs.FileType.File and i.base_name.endswith(".parquet")
               and not i.base_name.startswith((".", "_"))]
        return sorted(out)

    def _bad_files(self, files: list[str]) -> dict[str, str]:
        bad = {}
        for f in files:
            try:
                with self.fs.open_input_file(f) as fh:
                    pq.ParquetFile(fh).read()
            except (pa.ArrowException, OSError) as e:
                bad[f] = str(e).splitlines()[0]
        return bad

    def _readable(self, table: str, files: list[str], err: Exception, skip_bad: bool) -> list[str]:
        """After a failed read: name the corrupt files (StoreError), or with skip_bad return the others."""
        bad = self._bad_files(files)
        if not bad:
            raise StoreError(f"reading table {table} from {self.uri}: {err}") from None
        if not skip_bad:
            listing = "; ".join(f"{f}: {why}" for f, why in bad.items())
            raise StoreError(f"corrupt Parquet file(s) in {table}: {listing}. "
                             "Pass --skip-bad (skip_bad=True) to read the rest.") from None
        for f in bad:
            print(f"loopstudy: skipping corrupt file {f}", file=sys.stderr)
        return [f for f in files if f not in bad]

    def read(self, table: str, study: str | None = None, skip_bad: bool = False) -> pa.Table:
        """All rows of `table` (one study or all), with a `study` column, under the table's current schema."""
        sch = schema(table)
        files = self.files(table, study)
        part = pads.partitioning(pa.schema([("study", pa.string())]), flavor="hive")
        full_schema = sch.append(pa.field("study", pa.string()))
        if not files:
            return full_schema.empty_table()

        def load(fs_list: list[str]) -> pa.Table:
            ds = pads.dataset(fs_list, schema=full_schema, format="parquet", filesystem=self.fs,
                              partitioning=part, partition_base_dir=f"{self.root}/{table}")
            return ds.to_table()

        try:
            return load(files)
        except (pa.ArrowException, OSError) as err:
            good = self._readable(table, files, err, skip_bad)
            return load(good) if good else full_schema.empty_table()

    def scan(self, table: str, study: str | None = None, skip_bad: bool = False):
        """The table as a Polars frame (read eagerly, returned lazy), with a `study` column.

        Local stores are read by Polars' own multi-threaded Parquet reader (pyarrow's per-file dataset overhead
        dominates with thousands of small files); object stores go through pyarrow.fs (read()).
        """
        import polars as pl

        if not self.local:
            # one chunk per file would make the conversion crawl over many tiny chunks: combine them first
            return pl.from_arrow(self.read(table, study, skip_bad).combine_chunks()).lazy()
        sch = pl.from_arrow(schema(table).empty_table()).schema

        def load(files: list[str]) -> pl.DataFrame:
            return pl.scan_parquet(files, schema=sch, missing_columns="insert", extra_columns="ignore").collect()

        frames = []
        for s in [study] if study else self.studies():
            files = self.files(table, s)
            if not files:
                continue
            try:
                df = load(files)
            except (pl.exceptions.PolarsError, OSError) as err:
                good = self._readable(table, files, err, skip_bad)
                if not good:
                    continue
                df = load(good)
            frames.append(df.with_columns(pl.lit(s).alias("study")))
        if not frames:
            return pl.DataFrame(schema={**sch, "study": pl.String}).lazy()
        return pl.concat(frames).lazy()

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

    def completed_trials(self, study: str) -> set[str]:
        """Trial ids whose results are complete (the trials row, written last, says status=complete)."""
        t = self.read("trials", study, skip_bad=True)
        if t.num_rows == 0:
            return set()
        ids, status = t.column("trial_id").to_pylist(), t.column("status").to_pylist()
        return {i for i, s in zip(ids, status) if s == "complete"}


def now_utc() -> datetime:
    return datetime.now(UTC)
