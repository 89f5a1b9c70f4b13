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
import time
import types
import typing
import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from study.config import TrialConfig, check_study_name, is_study_name

SCHEMA_VERSION = 1
COMPACTED = "_compacted.parquet"  # a study's merged trials, per table (`loopstudy compact`)
STRAY = "stray: "  # marks a _check_file verdict that leaves the file out always (not a trial's own file)
TRIAL_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*\.parquet")  # <trial_id>.parquet: what a trial writes, nothing else

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


@dataclass(frozen=True, slots=True)
class Entry:
    """A listed file or folder (the fields of pyarrow's FileInfo that the store uses)."""

    path: str
    base_name: str
    size: int | None
    mtime_ns: int | None
    is_file: bool


def file_trial_id(path: str) -> str:
    """The trial id a trial file is named for: `.../<trial_id>.parquet` -> `<trial_id>`."""
    return path.rsplit("/", 1)[-1].removesuffix(".parquet")


def has_parquet_tail(path: str) -> bool:
    """Whether a local file ends the way every complete Parquet file does (footer, then the magic 'PAR1'): a
    truncated or overwritten file does not. One open, a seek and a 4-byte read (~8 us), no parsing: the driver
    checks 50,000 files of a 10,000-trial study this way in about 0.4 s."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        size = os.lseek(fd, 0, os.SEEK_END)
        return size >= 12 and os.pread(fd, 4, size - 4) == b"PAR1"
    finally:
        os.close(fd)


def resolve_root(root: str | os.PathLike) -> str:
    """A results root as every command and trial sees it: an object-store URI as given, a path made absolute
    (trials run in other working folders)."""
    root = str(root)
    return root if "://" in root else os.path.abspath(root)


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
        self._verdicts: dict[tuple, str | None] = {}
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
            raise StoreError(f"trial id {trial_id!r} is not allowed: letters, digits, '_' and '-', starting with a "
                             "letter or digit")
        names = set(sch.names)
        unknown = sorted({k for r in rows for k in r} - names - {"study"})
        if unknown:
            raise StoreError(f"table {table}: columns {unknown} are not in its schema")
        full = [{**{n: None for n in sch.names}, **r, "trial_id": trial_id, "schema_version": SCHEMA_VERSION}
                for r in rows]
        for r in full:
            r.pop("study", None)
        data = pa.Table.from_pylist(full, schema=sch)
        final = f"{self._dir(table, study)}/{trial_id}.parquet"
        self._write_atomic(data, final)
        return final

    def _write_atomic(self, data: pa.Table, final: str) -> None:
        d, name = final.rsplit("/", 1)
        self.fs.create_dir(d, recursive=True)
        if self.local:
            tmp = f"{d}/.{name}.{uuid.uuid4().hex[:8]}.tmp"
            try:
                pq.write_table(data, tmp, filesystem=self.fs)
                self.fs.move(tmp, final)  # rename: readers see the old file or the new one, never half of one
            finally:
                if self.fs.get_file_info(tmp).type != pafs.FileType.NotFound:
                    self.fs.delete_file(tmp)
        else:
            pq.write_table(data, final, filesystem=self.fs)  # a single PUT, visible only when complete

    # -- listing ---------------------------------------------------------------------------------------------------
    def studies(self) -> list[str]:
        """Studies with at least one file in any table (folders whose name breaks the study-name rule are not)."""
        found: set[str] = set()
        for table in TABLES:
            base = f"{self.root}/{table}"
            for info in self.fs.get_file_info(pafs.FileSelector(base, allow_not_found=True)):
                name = info.base_name[len("study="):]
                if info.type == pafs.FileType.Directory and info.base_name.startswith("study=") and \
                        is_study_name(name):
                    found.add(name)
        return sorted(found)

    def _warn(self, path: str, why: str) -> None:
        if path not in self._warned:  # once per file and Store, however many tables a command reads
            self._warned.add(path)
            print(f"loopstudy: left out {path}: {why}", file=sys.stderr)

    def _entries(self, base: str, recursive: bool) -> list[Entry]:
        """What lies under `base` (nothing when it is missing). A local folder is read with os.scandir: at 10,000
        trial files that is several times faster than pyarrow's FileInfo listing."""
        if self.local and not recursive:
            try:
                it = os.scandir(base)
            except (FileNotFoundError, NotADirectoryError):
                return []
            out = []
            with it:
                for e in it:
                    if e.name.startswith("."):  # writes in flight: renamed away at any moment, never read
                        continue
                    if e.is_file(follow_symlinks=False):
                        try:
                            st = e.stat(follow_symlinks=False)
                        except FileNotFoundError:  # removed since the listing (a compaction): not there
                            continue
                        out.append(Entry(e.path, e.name, st.st_size, st.st_mtime_ns, True))
                    else:
                        out.append(Entry(e.path, e.name, None, None, False))
            return out
        sel = pafs.FileSelector(base, recursive=recursive, allow_not_found=True)
        return [Entry(i.path, i.base_name, i.size, i.mtime_ns, i.type == pafs.FileType.File)
                for i in self.fs.get_file_info(sel)]

    def _list(self, table: str, study: str | None) -> tuple[list[Entry], list[Entry]]:
        """(trial files, compacted files) of the table, one study or all, with size and mtime.

        Only `<table>/study=<name>/<trial_id>.parquet` and `<table>/study=<name>/_compacted.parquet` count. Anything
        else (a stray copy such as `<id> (1).parquet`, a `backup/` folder, a folder whose name breaks the study-name
        rule) would count a trial twice: it is named on stderr and left out. Dot-files (writes in flight) are passed
        over silently.
        """
        schema(table)  # validates the table name
        base = f"{self.root}/{table}" + (f"/study={check_study_name(study)}" if study is not None else "")
        trial, compacted = [], []
        for entry in self._entries(base, recursive=study is None):
            if entry.base_name.startswith(".") or (not entry.is_file and study is None):
                continue
            if study is not None:  # listed in the study's own folder: only the file name is in question
                in_place = entry.is_file
            else:
                parts = entry.path[len(base) + 1:].split("/")
                name = parts[0][len("study="):] if parts[0].startswith("study=") else ""
                in_place = len(parts) == 2 and is_study_name(name)
            if in_place and entry.base_name == COMPACTED:
                compacted.append(entry)
            elif in_place and TRIAL_FILE.fullmatch(entry.base_name):
                trial.append(entry)
            else:
                self._warn(entry.path, "not a trial file (<table>/study=<name>/<trial_id>.parquet)")
        return sorted(trial, key=lambda i: i.path), sorted(compacted, key=lambda i: i.path)

    def is_compacted(self, study: str) -> bool:
        """Whether `loopstudy compact` has merged trials of the study (its trials table has a compacted file)."""
        return bool(self._list("trials", study)[1])

    def files(self, table: str, study: str | None = None) -> list[str]:
        """Paths of the table's per-trial files (not yet compacted), one study or all; strays named and left out."""
        return [i.path for i in self._list(table, study)[0]]

    # -- checking --------------------------------------------------------------------------------------------------
    def _check_file(self, table: str, info: Entry | pafs.FileInfo, want: pa.Schema) -> str | None:
        """Why the file cannot be read as part of `table` (None when it can), from its footer alone: unreadable,
        a column of the wrong type, or (a trial file) rows of another trial than its name says. Remembered per
        file version (size, mtime) for this Store, since one command scans a table many times."""
        key = (table, info.path, info.size, info.mtime_ns)
        if key not in self._verdicts:
            self._verdicts[key] = self._footer_verdict(table, info.path, want)
        return self._verdicts[key]

    def _footer_verdict(self, table: str, path: str, want: pa.Schema) -> str | None:
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
        col = got.get_field_index("trial_id")
        if col < 0:
            return "no trial_id column"
        stem = file_trial_id(path)
        if path.endswith("/" + COMPACTED):
            return None
        for g in range(meta.num_row_groups):
            stats = meta.row_group(g).column(col).statistics
            if stats is not None and stats.has_min_max and (stats.min, stats.max) != (stem, stem):
                return f"{STRAY}its rows belong to trial {stats.min!r}, not {stem!r} (a renamed copy?)"
        return None

    def _sound(self, info: Entry | pafs.FileInfo) -> bool:
        """Cheap whole-file check without parsing (see has_parquet_tail). Local files only: a read per object would
        cost a request each, and object-store writes are single PUTs, never half a file."""
        if info.size is None or info.size < 12:
            return False
        return has_parquet_tail(info.path) if self.local else True

    def _sources(self, table: str, study: str | None, skip_bad: bool) -> tuple[list[str], list[str]]:
        """(trial files, compacted files) whose footers show them sound and of the table's schema. A bad file is a
        StoreError naming it, or with skip_bad is named on stderr and left out; a file of another trial than its
        name says is always left out (named)."""
        want = schema(table)
        trial_infos, compacted_infos = self._list(table, study)
        if compacted_infos:  # files a running compaction is about to remove: read their rows from its output
            doomed = self._being_compacted(study)
            trial_infos = [i for i in trial_infos if doomed.get(i.path) != [i.size, i.mtime_ns]]
        kept: dict[str, list[str]] = {"trial": [], "compacted": []}
        bad = {}
        for kind, infos in (("trial", trial_infos), ("compacted", compacted_infos)):
            for info in infos:
                why = self._check_file(table, info, want)
                if why is None:
                    kept[kind].append(info.path)
                elif why.startswith(STRAY):
                    self._warn(info.path, why[len(STRAY):])
                else:
                    bad[info.path] = why
        if bad and not skip_bad:
            listing = "; ".join(f"{f}: {why}" for f, why in bad.items())
            raise StoreError(f"bad Parquet file(s) in {table}: {listing}. "
                             "Pass --skip-bad (skip_bad=True) to read the rest.")
        for f, why in bad.items():
            self._warn(f, why)
        return kept["trial"], kept["compacted"]

    def _being_compacted(self, study: str | None) -> dict[str, list[int]]:
        """{path: [size, mtime_ns]} of per-trial files that a compaction has merged and is removing."""
        out: dict[str, list[int]] = {}
        for s in [study] if study is not None else self.studies():
            text = self.get_text(f"_compacting/{s}.json")
            if text:
                out.update(json.loads(text))
        return out

    # -- reading ---------------------------------------------------------------------------------------------------
    def _polars_path(self, path: str) -> str:
        return path if self.local else f"{self.uri.split('://', 1)[0]}://{path}"

    def _polars_options(self) -> dict[str, str] | None:
        """storage_options for Polars' object-store reader, from the URI's query (endpoint_override, scheme,
        region: the pyarrow.fs spelling); credentials come from the environment as for pyarrow."""
        if self.local or "?" not in self.uri:
            return None
        query = dict(urllib.parse.parse_qsl(self.uri.split("?", 1)[1]))
        opts = {}
        if "endpoint_override" in query:
            scheme = query.get("scheme", "https")
            opts["aws_endpoint_url"] = f"{scheme}://{query['endpoint_override']}"
            if scheme == "http":
                opts["aws_allow_http"] = "true"
        if "region" in query:
            opts["aws_region"] = query["region"]
        return opts or None

    def scan(self, table: str, study: str | None = None, skip_bad: bool = False):
        """The table as a Polars LazyFrame with a `study` column (Hive partition), for local and object-store roots:
        projections and filters reach the Parquet scan, nothing is read until collect().

        Rows come from the per-trial files and from the study's compacted file; a trial that has its own file again
        (re-run after compaction, or mid-compaction) is read from that file only, so every trial counts once.
        """
        import polars as pl

        sch = pl.from_arrow(schema(table).empty_table()).schema
        trial, compacted = self._sources(table, study, skip_bad)
        opts = {"schema": sch, "missing_columns": "insert", "extra_columns": "ignore", "hive_partitioning": True,
                "hive_schema": {"study": pl.String}, "storage_options": self._polars_options()}
        frames = []
        if trial:
            frames.append(pl.scan_parquet([self._polars_path(f) for f in trial], **opts))
        if compacted:
            comp = pl.scan_parquet([self._polars_path(f) for f in compacted], **opts)
            own = [f"{p.rsplit('/', 2)[-2][len('study='):]}/{file_trial_id(p)}" for p in trial]
            if own:
                comp = comp.filter(~pl.concat_str([pl.col("study"), pl.col("trial_id")], separator="/").is_in(own))
            frames.append(comp)
        if not frames:
            return pl.LazyFrame(schema={**sch, "study": pl.String})
        return pl.concat(frames, how="vertical") if len(frames) > 1 else frames[0]

    def read(self, table: str, study: str | None = None, skip_bad: bool = False) -> pa.Table:
        """All rows of `table` (one study or all), with a `study` column, under the table's current schema."""
        import polars as pl

        full = schema(table).append(pa.field("study", pa.string()))
        try:
            return self.scan(table, study, skip_bad).collect().to_arrow().cast(full)
        except (pl.exceptions.PolarsError, OSError) as err:  # damage past the footer
            raise StoreError(f"reading table {table} from {self.uri}: {err}") from None

    def put_text(self, rel: str, text: str) -> None:
        """A small text file under the root (e.g. _studies/<name>.yaml); readers of tables ignore '_' dirs."""
        path = f"{self.root}/{rel}"
        d, name = path.rsplit("/", 1)
        self.fs.create_dir(d, recursive=True)
        tmp = f"{d}/.{name}.{uuid.uuid4().hex[:8]}.tmp" if self.local else path  # a reader never sees half of it
        with self.fs.open_output_stream(tmp) as f:
            f.write(text.encode())
        if tmp != path:
            self.fs.move(tmp, path)

    def get_text(self, rel: str) -> str | None:
        path = f"{self.root}/{rel}"
        if self.fs.get_file_info(path).type != pafs.FileType.File:
            return None
        try:
            with self.fs.open_input_stream(path) as f:
                return f.read().decode()
        except FileNotFoundError:  # never written, or removed meanwhile (a compaction's marker)
            return None

    # -- completeness ----------------------------------------------------------------------------------------------
    def _compacted_ids(self, study: str, trial_id: str | None = None) -> set[str]:
        """Trials held by the study's compacted files (one trial's id, or all): compaction moves only complete
        trials, every table at once, so the compacted trials table is their record; every table's compacted
        file must be sound for it to count."""
        import polars as pl

        path = f"{self._dir('trials', study)}/{COMPACTED}"
        for table in TABLES:
            info = self.fs.get_file_info(f"{self._dir(table, study)}/{COMPACTED}")
            if info.type != pafs.FileType.File or not self._sound(info) or self._check_file(table, info, schema(table)):
                return set()
        lf = pl.scan_parquet(self._polars_path(path), storage_options=self._polars_options()).select("trial_id")
        if trial_id is not None:
            lf = lf.filter(pl.col("trial_id") == trial_id)
        return set(lf.collect()["trial_id"].to_list())

    def completed_trials(self, study: str) -> set[str]:
        """Trial ids whose results are complete: a trials file (written last, only when the trial completed) and a
        sound file in every other table, or a place in the compacted files. A trial with a corrupt or missing file
        is not complete, so running the study again repairs it. Listings and one small read per file's last bytes:
        no Parquet is parsed, so 10,000 trials take a fraction of a second."""
        done: set[str] | None = None
        for table in TABLES:
            ids = self._sound_trial_ids(table, study)
            done = ids if done is None else done & ids
        return done | self._compacted_ids(study)

    def _sound_trial_ids(self, table: str, study: str) -> set[str]:
        """Ids of the study's per-trial files in `table` that pass _sound. Locally a fast path for the driver's
        once-per-run count: names from scandir (no stat per file), then has_parquet_tail."""
        if not self.local:
            return {file_trial_id(i.base_name) for i in self._list(table, study)[0] if self._sound(i)}
        d = self._dir(table, study)
        try:
            with os.scandir(d) as it:
                names = [e.name for e in it if TRIAL_FILE.fullmatch(e.name)]
        except (FileNotFoundError, NotADirectoryError):
            return set()
        return {file_trial_id(name) for name in names if has_parquet_tail(f"{d}/{name}")}

    def trial_row(self, study: str, trial_id: str) -> dict[str, Any] | None:
        """One trial's row of the trials table, from its own file (or the compacted file); None when it has none."""
        import polars as pl

        info = self.fs.get_file_info(f"{self._dir('trials', study)}/{trial_id}.parquet")
        if info.type == pafs.FileType.File and not self._check_file("trials", info, trials_schema()):
            with self.fs.open_input_file(info.path) as fh:
                rows = pq.read_table(fh).to_pylist()
            return rows[0] if rows else None
        if trial_id not in self._compacted_ids(study, trial_id):
            return None
        df = self.scan("trials", study, skip_bad=True).filter(pl.col("trial_id") == trial_id).collect()
        return df.row(0, named=True) if df.height else None

    def is_complete(self, study: str, trial_id: str) -> bool:
        """Whether one trial's results are complete, from its own files (or one filtered read of the compacted
        trials file): the cost does not grow with the number of trial files. Same rule as completed_trials."""
        infos = self.fs.get_file_info([f"{self._dir(t, study)}/{trial_id}.parquet" for t in TABLES])
        if all(i.type == pafs.FileType.File and self._sound(i) for i in infos):
            return not any(self._check_file(t, i, schema(t)) for t, i in zip(TABLES, infos))
        return trial_id in self._compacted_ids(study, trial_id)

    # -- compaction ------------------------------------------------------------------------------------------------
    def compact(self, study: str, on_table: Callable[[str, int, int], None] | None = None,
                grace_s: float = 5.0) -> dict[str, int]:
        """Merge the study's complete trials into one `_compacted.parquet` per table; returns counts.

        Every table's compacted file is written (temporary name, then rename: readers see the old file or the new)
        before any per-trial file is removed, and readers prefer a trial's own file over compacted rows, so reads
        are right before, during and after, and a crash at any point loses nothing. Per-trial files of trials not
        yet complete stay. A per-trial file that changed after it was read (a trial re-running) is not removed.
        Per-trial files go grace_s after the compacted files are in place: a read that listed them just before can
        still open them (one that lists and then waits longer fails with file-not-found; it is never wrong).
        on_table(table, trial_files_merged, rows) reports progress.
        """
        import polars as pl

        done = self.completed_trials(study)
        compacted = self._compacted_ids(study)
        for table in TABLES:  # a trial with a file the footer check refuses (named) stays out, files and all
            done &= {file_trial_id(p) for p in self._sources(table, study, True)[0]} | compacted
        listed = {t: {i.path: (i.size, i.mtime_ns) for i in self._list(t, study)[0]} for t in TABLES}
        merged = {t: [p for p in listed[t] if file_trial_id(p) in done] for t in TABLES}
        rows = {}
        for table in TABLES:
            sch = schema(table)
            df = (self.scan(table, study, skip_bad=True).filter(pl.col("trial_id").is_in(sorted(done)))
                  .drop("study").sort("trial_id").collect())
            data = df.to_arrow().cast(sch)
            final = f"{self._dir(table, study)}/{COMPACTED}"
            self._write_atomic(data, final)
            rows[table] = data.num_rows
            if on_table:
                on_table(table, len(merged[table]), data.num_rows)
        # Say which files are about to go before any goes: a read that lists files from now on leaves them out
        # (their rows are in the compacted files), one that listed them earlier has grace_s to open them.
        doomed = {p: listed[t][p] for t in TABLES for p in merged[t]}
        marker = f"_compacting/{study}.json"
        self.put_text(marker, json.dumps({p: [size, mtime] for p, (size, mtime) in doomed.items()}))
        time.sleep(grace_s if doomed else 0)
        removed = 0
        for path, stamp in doomed.items():
            info = self.fs.get_file_info(path)
            if info.type == pafs.FileType.File and (info.size, info.mtime_ns) == tuple(stamp):
                self.fs.delete_file(path)
                removed += 1
        self.fs.delete_file(f"{self.root}/{marker}")
        return {"trials": len(done), "files_removed": removed, **{f"{t}_rows": n for t, n in rows.items()}}


def now_utc() -> datetime:
    return datetime.now(UTC)
