"""`loopstudy query`: SQL over the store's tables, in a sandbox by construction rather than by pattern.

The query runs in DuckDB, in memory, on the tables it names (trials, train_curve, depth_eval, dynamics,
perturbation: read through the store, so the store's file rule and --skip-bad hold). Before the query runs, the
engine is shut off from the outside and its settings locked: no file can be read or written (`read_csv`, `COPY`,
`ATTACH`, a quoted path), no extension installed or loaded, no network reached (`enable_external_access = false`,
`lock_configuration = true`). Memory, returned rows and time are bounded (QueryLimits); every failure is one line of
a few hundred characters at most.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass

import polars as pl
import pyarrow as pa

from study.console import eprint
from study.errors import AnalysisError
from study.store import TABLES, Store

MAX_ERROR_CHARS = 300


@dataclass(frozen=True)
class QueryLimits:
    """What one query may take: rows returned (more are cut, with a line saying so), the engine's memory, and
    wall seconds (the query is interrupted after them)."""

    rows: int = 100_000
    memory: str = "2GB"
    seconds: float = 120.0


def named_tables(query: str) -> list[str]:
    """The store's tables a query names (as words, any case): only those are read."""
    return [t for t in TABLES if re.search(rf"\b{t}\b", query, re.IGNORECASE)]


def sandbox(store: Store, tables: list[str], study: str | None, skip_bad: bool, limits: QueryLimits):
    """A DuckDB connection that sees `tables` and nothing else, its settings locked."""
    import duckdb

    con = duckdb.connect(":memory:", config={"memory_limit": limits.memory, "threads": 2,
                                             "autoinstall_known_extensions": False,
                                             "autoload_known_extensions": False})
    for t in tables:
        con.register(t, store.read(t, study, skip_bad))
    con.execute("SET enable_external_access = false")  # files, extensions, network: off
    con.execute("SET lock_configuration = true")  # and no statement may turn them on again
    return con


def run_query(con, query: str, limits: QueryLimits) -> tuple[pa.Table, bool]:
    """(at most limits.rows rows of the result, whether there were more), interrupted after limits.seconds."""
    timer = threading.Timer(limits.seconds, con.interrupt)
    timer.start()
    try:
        relation = con.sql(query)
        if relation is None:  # a statement with no result (SET, CREATE ...): nothing to show
            return pa.table({}), False
        reader = relation.to_arrow_reader(min(limits.rows + 1, 100_000))
        batches, n = [], 0
        for batch in reader:
            batches.append(batch)
            n += batch.num_rows
            if n > limits.rows:
                break
        table = pa.Table.from_batches(batches, schema=reader.schema)
        return table.slice(0, limits.rows), n > limits.rows
    finally:
        timer.cancel()


def refusal(e: Exception, limits: QueryLimits) -> str:
    """One short line for why a query did not answer."""
    import duckdb

    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    if isinstance(e, duckdb.PermissionException):
        return (f"query refused: it reads files, loads extensions or reaches the network ({first[:120]}); SQL here "
                f"sees the store's tables only ({', '.join(TABLES)})")
    if isinstance(e, duckdb.InterruptException):
        return (f"query stopped after {limits.seconds:g}s (loopstudy's time limit): aggregate, filter or add a "
                "LIMIT")
    if isinstance(e, duckdb.OutOfMemoryException):
        return (f"query needs more than {limits.memory} of memory (loopstudy's limit): aggregate, filter or add "
                "a LIMIT")
    return f"query failed: {first}"[:MAX_ERROR_CHARS]


def sql(store: Store, query: str, study: str | None = None, skip_bad: bool = False,
        limits: QueryLimits = QueryLimits()) -> pl.DataFrame:
    """The query's answer over the store's tables (one study's rows with `study`), and nothing else."""
    import duckdb

    try:
        statements = len(duckdb.extract_statements(query))
    except duckdb.Error as e:
        raise AnalysisError(refusal(e, limits)) from None
    if statements != 1:  # DuckDB would answer only the last one
        raise AnalysisError(f"query: {statements} statements in one; give one per call (loopstudy query answers "
                            "one statement)")
    tables = named_tables(query)
    con = sandbox(store, tables, study, skip_bad, limits)
    try:
        table, cut = run_query(con, query, limits)
    except duckdb.Error as e:
        raise AnalysisError(refusal(e, limits)) from None
    finally:
        con.close()
    if cut:
        eprint(f"loopstudy: the first {limits.rows:,} rows; the query returns more (aggregate or add a LIMIT)")
    return pl.from_arrow(table) if table.num_columns else pl.DataFrame()
