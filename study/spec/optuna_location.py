"""Where a search's Optuna study lives (`sweep.optuna.storage`): the one rule, read by the spec's checks and by the
driver (study.run.optuna_storage opens it). Default: a JournalStorage file in the results root,
`<root>/_optuna/<study>.journal`; for an object-store root, where Optuna cannot append to a file, the same name
under this machine's cache. Otherwise an RDB URL or the path of a journal file."""

from __future__ import annotations

import os

from study.errors import ConfigError
from study.paths import is_uri, machine_cache
from study.store.layout import optuna_journal

RDB_SCHEMES = ("sqlite", "postgresql", "mysql", "oracle", "mssql")


def storage_location(configured: str | None, root: str, study: str) -> str:
    """The Optuna storage of a study: as configured (an RDB URL or a journal file path), else the default journal."""
    if configured:
        return configured
    return str(machine_cache() / "optuna" / f"{study}.journal") if is_uri(root) else optuna_journal(root, study)


def rdb_scheme(location: str) -> str:
    """The database of an RDB URL (`postgresql+psycopg2://...` -> `postgresql`)."""
    return location.split("://", 1)[0].split("+", 1)[0]


def check_location(location: str, source: str) -> None:
    """ConfigError when `location` is neither an RDB URL Optuna knows nor a journal file path."""
    if is_uri(location):
        if rdb_scheme(location) not in RDB_SCHEMES:
            raise ConfigError(f"{source}: sweep.optuna.storage {location!r}: an RDB URL ({', '.join(RDB_SCHEMES)}"
                              "://...) or the path of a journal file (e.g. results/_optuna/NAME.journal)")
    elif os.path.isdir(location):
        raise ConfigError(f"{source}: sweep.optuna.storage {location!r} is a folder; give a journal file's path "
                          "(e.g. results/_optuna/NAME.journal)")
