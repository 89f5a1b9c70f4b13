"""The results store: every trial's rows as Parquet, under a local, NFS or object-store root. Torch-free.

`Store` is the public face; the private modules beside it each do one job: `layout` (where files live), `names`
(what a study may be called), `schema` (each table's columns, from study.rows), `files` (the file system, atomic
writes), `integrity` (whether a file may be read), `listing` (which files belong to a study), `scan` (reading a
table), `completeness` and `compaction`.

The contract, stated once:
- Layout: `<root>/<table>/study=<name>/<trial_id>.parquet`, one file per trial per table, plus a study's
  `study.compacted.parquet` per table; `_`-folders hold the saved spec, compaction markers, Tune's state and the
  trials' weights (layout.py).
- Atomicity: every file is written whole under a temporary dot-name and renamed into place (one PUT on an object
  store): a reader sees the old file or the new one. A retried trial replaces its own files.
- Complete: a trial is complete when it has a `trials` file (written last, only on success) and a sound file
  (Parquet's magic at its end) in every other table, or a place in the study's compacted files. Anything less
  runs again.
- Reads: only files that follow the layout count; strays are named on stderr and left out, corrupt or wrong-typed
  files are an error (or, with skip_bad, named and left out). A trial's own file takes precedence over its
  compacted rows (a trial read mid-compaction counts once), and a trial that runs again after compaction first
  takes its rows out of the compacted files. Files under an older schema load with nulls in the newer columns.
- Outside readers: at rest (no write or compaction in flight) a table is exactly the Parquet files under
  `<root>/<table>/`, Hive-partitioned by `study`, no file name starting with `_` or `.`: DuckDB
  (`read_parquet('<root>/<table>/**/*.parquet', hive_partitioning=true)`), pyarrow.dataset, pandas and Polars
  read the same rows as loopstudy (stray files that loopstudy names and leaves out aside).
- Concurrency: trials write only their own files, so any number of writers on any number of nodes never collide;
  compaction writes its files before it removes any and leaves a marker naming what it removes, so reads are right
  before, during and after it. One driver runs a study at a time (a renewed lease, `_leases/<name>.json`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from study.errors import StoreError
from study.paths import resolve_root
from study.store import compaction, completeness, listing, scan
from study.store.files import Root
from study.store.integrity import has_parquet_tail
from study.store.layout import COMPACTED, TRIAL_FILE, file_trial_id, trial_file
from study.store.lease import StudyLease
from study.store.schema import (
    SCHEMA_VERSION,
    SCHEMAS,
    TABLES,
    config_row,
    schema,
    table_rows,
    trials_schema,
)

__all__ = ["COMPACTED", "SCHEMAS", "SCHEMA_VERSION", "TABLES", "Store", "config_row",
           "file_trial_id", "has_parquet_tail", "now_utc", "resolve_root", "schema", "trials_schema"]


class Store:
    """Results under a root: a local/NFS path or an object-store URI (s3://bucket/prefix?endpoint_override=...).
    Every method that takes a study checks it (listing.check_study: the name rule, no linked folder)."""

    def __init__(self, root: str | os.PathLike):
        self._root = Root.open(str(root))
        self._writing: set[tuple[str, str]] = set()  # (study, trial) this Store has written: evicted already

    def _study(self, study: str | None) -> str | None:
        """A study a method was given, checked (listing.check_study); None (every study) as it is."""
        return study if study is None else listing.check_study(self._root, study)

    @property
    def uri(self) -> str:
        return self._root.uri

    @property
    def local(self) -> bool:
        return self._root.local

    def __repr__(self) -> str:
        return f"Store({self.uri!r})"

    def exists(self) -> bool:
        """Whether the root is there (a store that was never written to is not)."""
        return self._root.kind(self._root.root) == pafs.FileType.Directory

    def require(self) -> Store:
        """self, or StoreError when the root does not exist (reading commands: say so rather than show 0 rows)."""
        if not self.exists():
            raise StoreError(f"no results store at {self.uri}: nothing has been written there (check --store)")
        return self

    # -- writing ---------------------------------------------------------------------------------------------------
    def write(self, table: str, study: str, trial_id: str, rows: list[dict[str, Any]]) -> str:
        """Write (or replace) one trial's rows of one table; returns the file path."""
        if not TRIAL_FILE.fullmatch(f"{trial_id}.parquet"):
            raise StoreError(f"trial id {trial_id!r} is not allowed: letters, digits, '_' and '-', starting with a "
                             "letter or digit")
        data = table_rows(table, trial_id, rows)
        final = trial_file(self._root.root, table, self._study(study), trial_id)
        if (study, trial_id) not in self._writing:  # its first write here: a compacted trial runs again
            compaction.evict(self._root, study, trial_id)
            self._writing.add((study, trial_id))
        self._root.write_table(data, final)
        return final

    def put_bytes(self, rel: str, data: bytes) -> None:
        """A file under the root (e.g. a trial's weights under _weights/), written atomically."""
        self._root.put_bytes(rel, data)

    def get_bytes(self, rel: str) -> bytes | None:
        """A file under the root; None when there is none."""
        return self._root.get_bytes(rel)

    def put_text(self, rel: str, text: str) -> None:
        """A small text file under the root (e.g. _studies/<name>.yaml); readers of tables ignore '_' dirs."""
        self._root.put_text(rel, text)

    def remove_text(self, rel: str) -> None:
        """Remove a small text file under the root (written by put_text)."""
        self._root.fs.delete_file(f"{self._root.root}/{rel}")

    def get_text(self, rel: str) -> str | None:
        """A small text file under the root; None when there is none."""
        return self._root.get_text(rel)

    # -- listing and reading ---------------------------------------------------------------------------------------
    def studies(self) -> list[str]:
        """Studies with at least one file in any table."""
        return listing.studies(self._root)

    def files(self, table: str, study: str | None = None) -> list[str]:
        """Paths of the table's per-trial files (not yet compacted), one study or all; strays named and left out."""
        return [i.path for i in listing.list_table(self._root, table, study)[0]]

    def is_compacted(self, study: str) -> bool:
        """Whether `loopstudy compact` has merged trials of the study (its trials table has a compacted file)."""
        return bool(listing.list_table(self._root, "trials", study)[1])

    def scan(self, table: str, study: str | None = None, skip_bad: bool = False):
        """The table as a Polars LazyFrame with a `study` column; per-trial and compacted rows, each trial once."""
        return scan.scan(self._root, table, self._study(study), skip_bad)

    def read(self, table: str, study: str | None = None, skip_bad: bool = False) -> pa.Table:
        """All rows of `table` (one study or all), with a `study` column, under the table's current schema."""
        return scan.read(self._root, table, self._study(study), skip_bad)

    # -- completeness ----------------------------------------------------------------------------------------------
    def completed_trials(self, study: str) -> set[str]:
        """Trial ids whose results are complete (see the contract above), from listings alone."""
        return completeness.completed_trials(self._root, self._study(study))

    def is_complete(self, study: str, trial_id: str) -> bool:
        """Whether one trial's results are complete, at a cost that does not grow with the study."""
        return completeness.is_complete(self._root, self._study(study), trial_id)

    def trial_row(self, study: str, trial_id: str) -> dict[str, Any] | None:
        """One trial's row of the trials table; None when it has none."""
        return completeness.trial_row(self._root, self._study(study), trial_id)

    def lease(self, study: str) -> StudyLease:
        """`with store.lease(name):` one driver per study at a time (see lease.py)."""
        return StudyLease(self._root, self._study(study))

    # -- compaction ------------------------------------------------------------------------------------------------
    def compact(self, study: str, on_table: Callable[[str, int, int], None] | None = None,
                grace_s: float = 5.0) -> dict[str, int]:
        """Merge the study's complete trials into one `study.compacted.parquet` per table (see compaction.py)."""
        return compaction.compact(self._root, self._study(study), on_table, grace_s)


def now_utc() -> datetime:
    return datetime.now(UTC)
