"""Allocation benchmark: ours against a raw-SQL baseline measured in the same run.

For 1, 4 and 16 concurrent OS processes, on SQLite (filelock + BEGIN IMMEDIATE) and on
Postgres (pg_advisory_xact_lock), every process allocates new keys in one ISO week:

- ours: `episodic.pipeline.allocation.allocate` (SQLAlchemy engine, tenacity wrapper, validation);
- baseline: one raw sqlite3 / psycopg connection per process issuing the same lock, the same
  two selects and the same two inserts by hand.

Prints allocations/s, p50/p99 latency and the throughput ratio ours/baseline (target >= 0.8).
Then times cold starts of `episodic --help` and `episodic episodes list` (target < 0.5 s)
next to a bare `python -c pass` and `python -c "import sqlalchemy"` measured in the same run.

Run: make bench  (or .venv/bin/python -m bench.allocate [--total N] [--skip-postgres])
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

WEEK = "2026-W32"
CONCURRENCY = (1, 4, 16)


# ---------------------------------------------------------------- workers (child processes)
def _ours(url: str, keys: list[str], ready: Any, go: Any, out: Any) -> None:
    from episodic.core.ids import WeekId
    from episodic.pipeline.allocation import allocate
    from episodic.storage.engine import make_engine

    engine = make_engine(url)
    week = WeekId.parse(WEEK)
    allocate(engine, "weekly", week, f"warmup-{keys[0]}")  # connect + compile outside the clock
    ready.set()
    go.wait()
    latencies = []
    for key in keys:
        start = time.perf_counter()
        allocate(engine, "weekly", week, key)
        latencies.append(time.perf_counter() - start)
    out.put(latencies)


def _raw_sqlite_step(conn: Any, lock: Any, key: str) -> None:
    from episodic.storage.locks import LOCK_POLL_INTERVAL_S

    with lock.acquire(poll_interval=LOCK_POLL_INTERVAL_S):
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(
                "SELECT week_id, sequence, state, created_at FROM episodes "
                "WHERE pipeline = ? AND allocation_key = ?",
                ("weekly", key),
            ).fetchall()
            top = conn.execute(
                "SELECT max(sequence) FROM episodes WHERE pipeline = ? AND week_id = ?",
                ("weekly", WEEK),
            ).fetchone()[0]
            seq = 0 if top is None else top + 1
            now = datetime.now(UTC).replace(tzinfo=None).isoformat(sep=" ")
            pk = conn.execute(
                "INSERT INTO episodes (pipeline, week_id, sequence, episode_id, allocation_key, "
                "state, created_at, updated_at) VALUES (?, ?, ?, ?, ?, 'allocated', ?, ?) RETURNING id",
                ("weekly", WEEK, seq, f"{WEEK}-{seq}", key, now, now),
            ).fetchone()[0]
            conn.execute(
                "INSERT INTO episode_events (episode_pk, kind, at, detail) VALUES (?, 'allocated', ?, ?)",
                (pk, now, json.dumps({"allocation_key": key})),
            )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise


def _raw_pg_step(conn: Any, lock_key: int, key: str) -> None:
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key,))
        conn.execute(
            "SELECT week_id, sequence, state, created_at FROM episodes "
            "WHERE pipeline = %s AND allocation_key = %s",
            ("weekly", key),
        ).fetchall()
        top = conn.execute(
            "SELECT max(sequence) FROM episodes WHERE pipeline = %s AND week_id = %s",
            ("weekly", WEEK),
        ).fetchone()[0]
        seq = 0 if top is None else top + 1
        now = datetime.now(UTC)
        pk = conn.execute(
            "INSERT INTO episodes (pipeline, week_id, sequence, episode_id, allocation_key, state, "
            "created_at, updated_at) VALUES (%s, %s, %s, %s, %s, 'allocated', %s, %s) RETURNING id",
            ("weekly", WEEK, seq, f"{WEEK}-{seq}", key, now, now),
        ).fetchone()[0]
        conn.execute(
            "INSERT INTO episode_events (episode_pk, kind, at, detail) VALUES (%s, 'allocated', %s, %s)",
            (pk, now, json.dumps({"allocation_key": key})),
        )


def _baseline(url: str, keys: list[str], ready: Any, go: Any, out: Any) -> None:
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        import sqlite3

        from filelock import FileLock

        from episodic.storage.engine import make_engine
        from episodic.storage.locks import pipeline_lock_path

        lock = FileLock(pipeline_lock_path(make_engine(url), "weekly"))
        conn: Any = sqlite3.connect(str(parsed.database), timeout=30, isolation_level=None)
        for pragma in (
            "journal_mode=WAL",
            "busy_timeout=30000",
            "foreign_keys=ON",
            "synchronous=NORMAL",
        ):
            conn.execute(f"PRAGMA {pragma}")

        def step(key: str) -> None:
            _raw_sqlite_step(conn, lock, key)
    else:
        import psycopg

        from episodic.storage.tx import advisory_key

        conn = psycopg.connect(
            parsed.set(drivername="postgresql").render_as_string(hide_password=False)
        )
        lock_key = advisory_key("pipeline:weekly")

        def step(key: str) -> None:
            _raw_pg_step(conn, lock_key, key)

    step(f"warmup-{keys[0]}")
    ready.set()
    go.wait()
    latencies = []
    for key in keys:
        start = time.perf_counter()
        step(key)
        latencies.append(time.perf_counter() - start)
    out.put(latencies)


# ---------------------------------------------------------------- driver
def run_once(kind: str, url: str, processes: int, total: int) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    go = ctx.Event()
    out = ctx.Queue()
    per = total // processes
    target = _ours if kind == "ours" else _baseline
    workers, readies = [], []
    for p in range(processes):
        ready = ctx.Event()
        keys = [f"{kind}-{processes}-{p}-{n}" for n in range(per)]
        proc = ctx.Process(target=target, args=(url, keys, ready, go, out))
        proc.start()
        workers.append(proc)
        readies.append(ready)
    for ready in readies:
        if not ready.wait(120):
            raise RuntimeError("a worker did not start")
    start = time.perf_counter()
    go.set()
    latencies: list[float] = []
    for _ in workers:
        latencies.extend(out.get(timeout=600))
    elapsed = time.perf_counter() - start
    for proc in workers:
        proc.join()
        if proc.exitcode != 0:
            raise RuntimeError(f"worker exited {proc.exitcode}")
    latencies.sort()
    return {
        "rate": len(latencies) / elapsed,
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000,
    }


class Databases:
    def __init__(self, backend: str, root: Path) -> None:
        self.backend, self.root, self.count = backend, root, 0
        if backend == "postgres":
            from tests.databases import PostgresDatabases, require_postgres_or_reason

            reason = require_postgres_or_reason()
            if reason:
                raise SystemExit(f"postgres: {reason} (use --skip-postgres)")
            self.pg = PostgresDatabases()
            self.names: list[str] = []

    def fresh(self) -> str:
        from episodic.storage.engine import make_engine
        from episodic.storage.schema import upgrade

        self.count += 1
        if self.backend == "sqlite":
            url = f"sqlite:///{self.root / f'bench-{self.count}.db'}"
            engine = make_engine(url)
            upgrade(engine)
            engine.dispose()
            return url
        name = self.pg.fresh()
        self.names.append(name)
        return self.pg.url(name)

    def close(self) -> None:
        if self.backend == "postgres":
            for name in self.names:
                self.pg.drop(name)
            self.pg.close()


def bench_allocation(backends: list[str], total: int, repeats: int) -> bool:
    ok = True
    print(f"allocation: {total} new keys per run, best of {repeats} runs, same week\n")
    header = (
        f"{'backend':9} {'procs':>5} | {'ours/s':>8} {'p50 ms':>7} {'p99 ms':>7} | "
        f"{'raw/s':>8} {'p50 ms':>7} {'p99 ms':>7} | {'ratio':>5}"
    )
    print(header)
    print("-" * len(header))
    with tempfile.TemporaryDirectory(prefix="episodic-bench-") as tmp:
        for backend in backends:
            databases = Databases(backend, Path(tmp))
            try:
                for processes in CONCURRENCY:
                    best: dict[str, dict[str, float]] = {}
                    for _ in range(repeats):  # interleave ours and baseline against drift
                        for kind in ("baseline", "ours"):
                            result = run_once(kind, databases.fresh(), processes, total)
                            if kind not in best or result["rate"] > best[kind]["rate"]:
                                best[kind] = result
                    ours, raw = best["ours"], best["baseline"]
                    ratio = ours["rate"] / raw["rate"]
                    ok &= ratio >= 0.8
                    print(
                        f"{backend:9} {processes:>5} | {ours['rate']:>8.0f} {ours['p50_ms']:>7.2f} "
                        f"{ours['p99_ms']:>7.2f} | {raw['rate']:>8.0f} {raw['p50_ms']:>7.2f} "
                        f"{raw['p99_ms']:>7.2f} | {ratio:>5.2f}{'' if ratio >= 0.8 else '  < 0.8 target'}"
                    )
            finally:
                databases.close()
    return ok


def _time_command(argv: list[str], env: dict[str, str], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(
            argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True
        )
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_cold_start(runs: int) -> bool:
    import os

    bindir = Path(sys.executable).parent
    with tempfile.TemporaryDirectory(prefix="episodic-bench-cli-") as tmp:
        env = {**os.environ, "EPISODIC_HOME": tmp}
        subprocess.run(
            [str(bindir / "episodic"), "db", "upgrade"],
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        bare = _time_command([sys.executable, "-c", "pass"], env, runs)
        floor = _time_command(
            [sys.executable, "-c", "import sqlalchemy, pydantic_settings"], env, runs
        )
        rows = [
            ("episodic --help", [str(bindir / "episodic"), "--help"]),
            ("episodic episodes list", [str(bindir / "episodic"), "episodes", "list"]),
        ]
        print(f"\ncold start, median of {runs} runs (target < 0.5 s)")
        print(f"  python -c pass                                  {bare:6.3f} s")
        print(f"  python -c 'import sqlalchemy, pydantic_settings' {floor:6.3f} s  (library floor)")
        ok = True
        for label, argv in rows:
            seconds = _time_command(argv, env, runs)
            ok &= seconds < 0.5
            print(
                f"  {label:47} {seconds:6.3f} s  ({seconds / floor:.2f}x the library floor)"
                f"{'' if seconds < 0.5 else '  over target'}"
            )
        return ok


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--total", type=int, default=480, help="allocations per run (divisible by 16)"
    )
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--skip-postgres", action="store_true")
    parser.add_argument("--cold-runs", type=int, default=7)
    args = parser.parse_args()
    backends = ["sqlite"] if args.skip_postgres else ["sqlite", "postgres"]
    ok = bench_allocation(backends, args.total, args.repeats)
    ok &= bench_cold_start(args.cold_runs)
    print("\nall targets met" if ok else "\nsome targets missed (see above)")


if __name__ == "__main__":
    main()
