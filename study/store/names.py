"""The one rule for study names, applied by the spec, by every command that takes one and by the store."""

from __future__ import annotations

import re

from study.errors import ConfigError

# Study names become folder names (<root>/<table>/study=<name>/) and Hive partition values: letters, digits and
# '_', '.', '-' only, starting with a letter or digit. No '/' or '..' (a path outside the root), no '%' (pyarrow's
# Hive reader URL-decodes it, Polars' does not: the same file would read back under two names), no spaces or '='.
STUDY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")


def is_study_name(name: object) -> bool:
    """Whether `name` may name a study (see STUDY_NAME)."""
    return isinstance(name, str) and bool(STUDY_NAME.fullmatch(name)) and ".." not in name


def check_study_name(name: str) -> str:
    """`name`, or ConfigError saying what a study name may be."""
    if not is_study_name(name):
        raise ConfigError(f"study name {name!r} is not allowed: use 1-100 letters, digits, '_', '.' or '-', "
                          "starting with a letter or digit (no '/', '..', '%', spaces or '=')")
    return name
