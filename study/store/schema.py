"""Each table's Parquet schema, generated from the one definition of its rows (study.rows) and, for the trials
table, from the trial config's fields (one column per dotted key) and the metric registry (study.metrics)."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from datetime import datetime
from typing import Any, Literal

import pyarrow as pa

from study.errors import StoreError
from study.metrics import METRICS
from study.rows import ROWS, TrialRecord

SCHEMA_VERSION = 1
_KEY = [pa.field("trial_id", pa.string()), pa.field("schema_version", pa.int32())]


def arrow_type(tp: Any) -> pa.DataType:
    """Arrow type of a field's annotation: Optional[X] as X, Literals as text, lists and tuples as JSON text."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return arrow_type(args[0]) if len(args) == 1 else pa.string()
    if origin is Literal:
        return pa.string()
    if origin in (tuple, list) or tp in (tuple, list):
        return pa.string()
    if tp is datetime:
        return pa.timestamp("ms", tz="UTC")
    return {bool: pa.bool_(), int: pa.int64(), float: pa.float64(), str: pa.string()}.get(tp, pa.string())


def row_fields(cls: type, prefix: str = "") -> list[pa.Field]:
    """One column per leaf field of a dataclass; nested dataclasses (config sections) become dotted names."""
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            out += row_fields(tp, f"{prefix}{f.name}.")
        else:
            out.append(pa.field(f"{prefix}{f.name}", arrow_type(tp)))
    return out


def config_fields() -> list[pa.Field]:
    """The trial config's columns, named by dotted key ('model.carry.beta_init')."""
    from study.config import TrialConfig  # the config layer (and its task settings) only when a trials table is read

    return row_fields(TrialConfig)


def trials_schema() -> pa.Schema:
    metrics = [pa.field(name, pa.float64()) for name in METRICS]
    return pa.schema(_KEY + row_fields(TrialRecord) + metrics + config_fields())


SCHEMAS: dict[str, pa.Schema] = {table: pa.schema(_KEY + row_fields(cls)) for table, cls in ROWS.items()}
TABLES = ("trials", *SCHEMAS)


def schema(table: str) -> pa.Schema:
    if table == "trials":
        return trials_schema()
    if table not in SCHEMAS:
        raise StoreError(f"unknown table {table!r}; tables: {', '.join(TABLES)}")
    return SCHEMAS[table]


def config_row(cfg_dict: dict[str, Any]) -> dict[str, Any]:
    """Flatten a trial config dict to its dotted columns; lists and tuples become JSON text."""
    from study.config import flatten

    return {k: json.dumps(v) if isinstance(v, list | tuple) else v for k, v in flatten(cfg_dict).items()}


def config_from_row(row: dict[str, Any]) -> dict[str, Any]:
    """A trials row's config columns back to the nested config dict (config_row's inverse): list and tuple fields
    from their JSON text; null columns (fields the row's schema predates) left to their defaults."""
    from study.config import set_dotted

    data: dict[str, Any] = {}
    for f in config_fields():
        value = row.get(f.name)
        if value is None:
            continue
        if f.type == pa.string() and _is_sequence(f.name):
            value = json.loads(value)
        set_dotted(data, f.name, value)
    return data


def _is_sequence(dotted: str) -> bool:
    """Whether a dotted config key is a list or tuple field (stored as JSON text)."""
    from study.config import TrialConfig

    cls: Any = TrialConfig
    for part in dotted.split("."):
        tp = typing.get_type_hints(cls)[part]
        cls = tp
    args = [a for a in typing.get_args(cls) if a is not type(None)] if typing.get_origin(cls) in (
        typing.Union, types.UnionType) else [cls]
    return any(typing.get_origin(a) in (list, tuple) or a in (list, tuple) for a in args)


def table_rows(table: str, trial_id: str, rows: list[dict[str, Any]]) -> pa.Table:
    """A trial's rows as an Arrow table of `table`'s schema, keyed by trial_id; unknown columns are refused."""
    sch = schema(table)
    unknown = sorted({k for r in rows for k in r} - set(sch.names) - {"study"})
    if unknown:
        raise StoreError(f"table {table}: columns {unknown} are not in its schema")
    full = [{**{n: None for n in sch.names}, **r, "trial_id": trial_id, "schema_version": SCHEMA_VERSION}
            for r in rows]
    for r in full:
        r.pop("study", None)
    return pa.Table.from_pylist(full, schema=sch)
