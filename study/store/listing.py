"""Which files of a table belong to which study: the listing rule every read and every completeness check uses.

Only regular files (not links, folders or FIFOs) named `<table>/study=<name>/<trial_id>.parquet` and
`<table>/study=<name>/study.compacted.parquet` count (an earlier store's `_compacted.parquet` too, unless the new
file is beside it: then it is a compaction's leftover, about to go). Anything else (a stray copy such as
`<id> (1).parquet`, a `backup/` folder, a symlink or a folder named like a trial file, a folder whose name breaks
the study-name rule) would count a trial twice or not at all: it is named on stderr and left out, by reads and
completeness alike. Dot-files (writes in flight) are passed over. A study folder that is a symbolic link is not
followed, as DuckDB's and pyarrow's readers do not follow it: such a study is left out of every listing, and a
command that names it is refused (check_study), for reads, counts and writes alike.
"""

from __future__ import annotations

import os

import pyarrow.fs as pafs

from study.errors import StoreError
from study.store.files import LINKED, Entry, Root
from study.store.integrity import has_parquet_tail, sound
from study.store.layout import (
    COMPACTED,
    COMPACTED_NAMES,
    LEGACY_COMPACTED,
    TRIAL_FILE,
    compacted_file,
    file_trial_id,
    study_of_dir,
    table_dir,
)
from study.store.names import check_study_name, is_study_name
from study.store.schema import TABLES, schema


def linked_folders(root: Root, study: str) -> list[str]:
    """The study's table folders that are symbolic links (a local root's; an object store has none)."""
    if not root.local:
        return []
    return [d for t in TABLES if os.path.islink(d := table_dir(root.root, t, study))]


def check_study(root: Root, study: str) -> str:
    """`study`, or StoreError when its name breaks the rule or a folder of it is a symbolic link."""
    check_study_name(study)
    if linked := linked_folders(root, study):
        raise StoreError(f"study {study}: {linked[0]} is {LINKED}")
    return study


def studies(root: Root) -> list[str]:
    """Studies with at least one file in any table (folders whose name breaks the study-name rule are not, nor
    studies with a folder that is a symbolic link: named on stderr)."""
    found: set[str] = set()
    for table in TABLES:
        for info in root.fs.get_file_info(pafs.FileSelector(f"{root.root}/{table}", allow_not_found=True)):
            name = study_of_dir(info.base_name)
            if info.type == pafs.FileType.Directory and name is not None and is_study_name(name):
                found.add(name)
    linked = {name: linked_folders(root, name) for name in sorted(found)}
    for path in (p for paths in linked.values() for p in paths):
        root.warn(path, LINKED)
    return [name for name, paths in linked.items() if not paths]


def list_table(root: Root, table: str, study: str | None) -> tuple[list[Entry], list[Entry]]:
    """(trial files, compacted files) of the table, one study or all, with size and mtime, sorted by path."""
    schema(table)  # validates the table name
    base = table_dir(root.root, table, check_study(root, study)) if study is not None else f"{root.root}/{table}"
    trial, compacted = [], []
    for entry in root.entries(base, recursive=study is None):
        if entry.base_name.startswith(".") or (not entry.is_file and study is None):
            continue
        if study is not None:  # listed in the study's own folder: only the file name is in question
            in_place = entry.is_file
        else:
            parts = entry.path[len(base) + 1:].split("/")
            name = study_of_dir(parts[0]) or ""
            in_place = len(parts) == 2 and is_study_name(name)
        if in_place and entry.base_name in COMPACTED_NAMES:
            compacted.append(entry)
        elif in_place and TRIAL_FILE.fullmatch(entry.base_name):
            trial.append(entry)
        else:
            root.warn(entry.path, "not a trial file (<table>/study=<name>/<trial_id>.parquet)")
    newer = {e.path.rsplit("/", 1)[0] for e in compacted if e.base_name == COMPACTED}
    compacted = [e for e in compacted if e.base_name == COMPACTED or e.path.rsplit("/", 1)[0] not in newer]
    return sorted(trial, key=lambda i: i.path), sorted(compacted, key=lambda i: i.path)


def compacted_path(root: Root, table: str, study: str) -> str | None:
    """The study's compacted file of `table` (the current name first, then an earlier store's), if it has one."""
    for name in (COMPACTED, LEGACY_COMPACTED):
        path = compacted_file(root.root, table, study, name)
        if root.kind(path) == pafs.FileType.File:
            return path
    return None


def sound_trial_ids(root: Root, table: str, study: str) -> set[str]:
    """Ids of the study's per-trial files in `table` that pass the cheap soundness check. Locally a fast path for
    the driver's once-per-run count: names from scandir (no stat per file), then has_parquet_tail."""
    if not root.local:
        return {file_trial_id(i.base_name) for i in list_table(root, table, study)[0] if sound(root, i)}
    d = table_dir(root.root, table, study)
    try:
        with os.scandir(d) as it:
            names = [e.name for e in it if TRIAL_FILE.fullmatch(e.name) and e.is_file(follow_symlinks=False)]
    except (FileNotFoundError, NotADirectoryError):
        return set()
    return {file_trial_id(name) for name in names if has_parquet_tail(f"{d}/{name}")}
