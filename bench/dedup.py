"""Dedup decision latency and sweep time over 1,000,000 historical runs.

For each backend (SQLite: a temp file; Postgres: a throwaway database on the local server,
dropped at the end), in one run:

1. fill `runs` with `--runs` historical runs of one episode (default 1,000,000) by one
   set-based INSERT … SELECT (`generate_series` / a recursive CTE): created over the past
   `--runs` seconds, 10 runs per fingerprint (a request repeated over time), 99% completed and
   1% `running` with a lease that expired an hour ago (processes that were killed);
2. baseline: a primary-key lookup of a random run (`SELECT … FROM runs WHERE id = :id`, one
   transaction each, the same SQLAlchemy engine), `--samples` times: p50 and p99 in ms;
3. the dedup decision: `AdmissionStore.admit(…, create=False)` for a random existing fingerprint
   (the whole choke point: the per-fingerprint lock, the window read, the answer; nothing
   written), `--samples` times: p50, p99 and the ratios to the baseline (target: p50 < 3x);
4. the sweep (`episodic.pipeline.sweep`) over the table: first `--dry-run`, then for real; seconds,
   and the number of runs it reaped (must be the 1% stale; target: under 5 s).

A benchmark, never a test: nothing here asserts a timing.

Run: make bench  (or .venv/bin/python -m bench.dedup [--skip-postgres] [--runs N] [--samples N])
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PER_FINGERPRINT = 10

_FILL_PG = """
INSERT INTO runs (id, episode_pk, command, state, params, fingerprint, request_sha256,
                  created_at, started_at, heartbeat_at, lease_expires_at, finished_at)
SELECT md5('run' || g)::uuid::text, :pk, 'generate',
       CASE WHEN g % 100 = 0 THEN 'running' ELSE 'completed' END,
       '{}'::json,
       f.fp, f.rq,
       now() - (g || ' seconds')::interval,
       now() - (g || ' seconds')::interval,
       now() - (g || ' seconds')::interval,
       CASE WHEN g % 100 = 0 THEN now() - interval '1 hour' ELSE NULL END,
       CASE WHEN g % 100 = 0 THEN NULL ELSE now() - (g || ' seconds')::interval END
FROM generate_series(1, :n) AS g JOIN bench_fps f ON f.n = g % :fps
"""

_SQLITE_TS = "strftime('%Y-%m-%d %H:%M:%S', 'now', '-' || x || ' seconds') || '.000000'"
_FILL_SQLITE = f"""
WITH RECURSIVE g(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM g WHERE x < :n)
INSERT INTO runs (id, episode_pk, command, state, params, fingerprint, request_sha256,
                  created_at, started_at, heartbeat_at, lease_expires_at, finished_at)
SELECT printf('%036d', x), :pk, 'generate',
       CASE WHEN x % 100 = 0 THEN 'running' ELSE 'completed' END,
       '{{}}',
       f.fp, f.rq,
       {_SQLITE_TS}, {_SQLITE_TS}, {_SQLITE_TS},
       CASE WHEN x % 100 = 0
            THEN strftime('%Y-%m-%d %H:%M:%S', 'now', '-3600 seconds') || '.000000'
            ELSE NULL END,
       CASE WHEN x % 100 = 0 THEN NULL ELSE {_SQLITE_TS} END
FROM g JOIN bench_fps f ON f.n = x % :fps
"""


def _percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return statistics.median(ordered), p99


def bench_backend(backend: str, url: str, home: Path, runs: int, samples: int) -> dict[str, Any]:
    from sqlalchemy import select, text

    from episodic.core.dedup import RunRequest
    from episodic.core.ids import WeekId
    from episodic.core.settings import load_settings
    from episodic.pipeline.allocation import allocate
    from episodic.pipeline.sweep import sweep
    from episodic.storage.admission import AdmissionStore, DedupPolicy
    from episodic.storage.engine import make_engine
    from episodic.storage.episodes import EpisodeRepository
    from episodic.storage.models import RunRow
    from episodic.storage.schema import upgrade

    home.mkdir(parents=True, exist_ok=True)
    os.environ.update(EPISODIC_HOME=str(home), EPISODIC_DATABASE_URL=url)
    engine = make_engine(url)
    upgrade(engine)
    episode = allocate(engine, "weekly", WeekId.parse("2026-W32"), "bench:dedup").episode
    episodes = EpisodeRepository(engine)
    admission = AdmissionStore(engine)
    pk = episodes.episode_pk("weekly", str(episode.episode_id))
    fps = max(1, runs // PER_FINGERPRINT)
    requests = [
        RunRequest("weekly", str(episode.episode_id), "generate", {"n": n}) for n in range(fps)
    ]
    started = time.perf_counter()
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE bench_fps (n INTEGER PRIMARY KEY, fp TEXT, rq TEXT)"))
        conn.execute(
            text("INSERT INTO bench_fps (n, fp, rq) VALUES (:n, :fp, :rq)"),
            [{"n": n, "fp": r.fingerprint, "rq": r.request_sha256} for n, r in enumerate(requests)],
        )
        conn.execute(
            text(_FILL_PG if backend == "postgres" else _FILL_SQLITE),
            {"pk": pk, "n": runs, "fps": fps},
        )
        if backend == "postgres":
            conn.execute(text("ANALYZE runs"))
    if backend == "sqlite":
        with engine.begin() as conn:
            conn.execute(text("ANALYZE"))
    fill_s = time.perf_counter() - started
    with engine.connect() as conn:
        ids = list(conn.execute(select(RunRow.id).limit(5000)).scalars())
    rng = random.Random(8)
    table = RunRow.__table__

    def pk_lookup() -> None:
        with engine.connect() as conn, conn.begin():
            conn.execute(select(table).where(table.c.id == rng.choice(ids))).first()

    policy = DedupPolicy(window_s=900, pending_ttl_s=900, fallback_lease_s=30)

    def decide() -> None:  # the whole choke point; nothing to create
        admission.admit(
            pk, rng.choice(requests), {}, [], [], policy=policy, create=False, run_id=""
        )

    for fn in (pk_lookup, decide):  # warm both up (connections, statement caches)
        for _ in range(50):
            fn()
    timings: dict[str, list[float]] = {"pk": [], "dedup": []}
    for _ in range(samples):  # interleaved, so drift hits both alike
        for name, fn in (("pk", pk_lookup), ("dedup", decide)):
            t0 = time.perf_counter()
            fn()
            timings[name].append((time.perf_counter() - t0) * 1000)
    settings = load_settings()
    t0 = time.perf_counter()
    dry = sweep(engine, settings, dry_run=True)
    dry_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    real = sweep(engine, settings)
    sweep_s = time.perf_counter() - t0
    engine.dispose()
    return {
        "backend": backend,
        "runs": runs,
        "fill_s": fill_s,
        "pk": _percentiles(timings["pk"]),
        "dedup": _percentiles(timings["dedup"]),
        "dry_s": dry_s,
        "dry": dry.count("expired_runs"),
        "sweep_s": sweep_s,
        "reaped": real.count("expired_runs"),
    }


def _postgres() -> Any:
    from bench.claims import postgres_database as pg

    return pg()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--skip-postgres", action="store_true")
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--samples", type=int, default=2000)
    args = parser.parse_args()
    os.chdir(ROOT)
    print(f"dedup: {args.runs} historical runs, {args.samples} decisions per backend")
    results = []
    with tempfile.TemporaryDirectory(prefix="episodic-dedup-") as name:
        tmp = Path(name)
        url = f"sqlite:///{tmp / 'sqlite' / 'episodic.db'}"
        results.append(bench_backend("sqlite", url, tmp / "sqlite", args.runs, args.samples))
        if not args.skip_postgres:
            with _postgres() as pg_url:
                results.append(
                    bench_backend("postgres", pg_url, tmp / "pg", args.runs, args.samples)
                )
    header = (
        f"{'backend':9} {'runs':>9} {'fill s':>7} {'pk p50':>7} {'pk p99':>7} "
        f"{'dedup p50':>9} {'dedup p99':>9} {'p50 x':>6} {'p99 x':>6} "
        f"{'sweep dry s':>11} {'sweep s':>8} {'reaped':>7} {'stale':>6}"
    )
    print("\n" + header + "\n" + "-" * len(header))
    for r in results:
        print(
            f"{r['backend']:9} {r['runs']:>9} {r['fill_s']:>7.1f} {r['pk'][0]:>7.3f} "
            f"{r['pk'][1]:>7.3f} {r['dedup'][0]:>9.3f} {r['dedup'][1]:>9.3f} "
            f"{r['dedup'][0] / r['pk'][0]:>6.2f} {r['dedup'][1] / r['pk'][1]:>6.2f} "
            f"{r['dry_s']:>11.2f} {r['sweep_s']:>8.2f} {r['reaped']:>7} {r['runs'] // 100:>6}"
        )
    print(
        "\nms; p50 x / p99 x = dedup decision / primary-key lookup (same database, same run; "
        "target p50 x < 3); sweep s over the whole table (target < 5 s); reaped = stale "
        "running runs moved to failed, of the 1% stale (a decision that met its request's "
        "dead run inside the window took it over instead: the choke point's takeover)."
    )


if __name__ == "__main__":
    main()
