"""The per-item ledger against its real floor, on SQLite and PostgreSQL.

A paid item needs a few committed transactions by design: the claim with the intent of the
call, the acceptance (remote reference), the outcome with its cost. (The check that the claim
still holds right before the call is the claim's own transaction when the call follows it at
once, as here; see `Runner._holds`.) The floor is raw SQL through the bare driver (sqlite3,
psycopg, same pragmas) issuing the same commits per item on the project's own tables and
indexes: the same reads (the run, the item, the provider's slots, the run's spend and the
pipeline's period budgets, with their advisory locks on Postgres: `episodic.storage.budgets`; both
sides run under a weekly budget, so its period read is counted too), UPDATEs and INSERTs, not
single-row inserts; around them, the same work that is not bookkeeping, done inline (the
fake provider's submit and collect, the image written atomically), so the ratio is what
claims, leases and the ledger cost above the bare minimum.
Our figure is the engine's whole path for a run of zero-latency items, in the same run.

    ratio = engine items/s / floor items/s      target >= 0.5x, with 1 and 8 items at once

Each figure is the median of `--rounds` (3) rounds that measure the floor and the engine one
after the other, so a machine whose speed drifts during the run affects both sides alike.

Run: make bench  (or .venv/bin/python -m bench.ledger [--items N] [--skip-postgres])
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parent.parent


def _episode(url: str, home: Path, items: int, key: str) -> tuple[str, int]:
    """A planned episode of `items` images; returns (episode id, episode pk)."""
    from episodic.core.ids import WeekId
    from episodic.pipeline.allocation import allocate
    from episodic.pipeline.episode_plan import record_plan
    from episodic.storage.engine import make_engine
    from episodic.storage.episodes import EpisodeRepository
    from episodic.storage.schema import upgrade
    from tests.generation import write_playlist

    engine = make_engine(url)
    upgrade(engine)
    episode = str(allocate(engine, "weekly", WeekId.parse("2026-W32"), key).episode.episode_id)
    playlist = write_playlist(home / key, [f"video {n}" for n in range(items)])
    record_plan(engine, "weekly", episode, playlist)
    pk = EpisodeRepository(engine).episode_pk("weekly", episode)
    engine.dispose()
    return episode, pk


def engine_rate(url: str, home: Path, items: int, concurrency: int, tag: str = "") -> float:
    """Items per second through the engine (zero-latency fake provider)."""
    from episodic.core.planning import RunOptions
    from episodic.core.settings import load_settings
    from episodic.pipeline.gate import EnvironmentCredentials
    from episodic.pipeline.generation import generate
    from episodic.storage.engine import make_engine

    episode, _ = _episode(url, home, items, f"engine-c{concurrency}{tag}")
    engine = make_engine(url)
    options = RunOptions(concurrency=concurrency, max_images=items)
    start = time.perf_counter()
    outcome = generate(
        engine, load_settings(), "weekly", episode, options, EnvironmentCredentials()
    )
    elapsed = time.perf_counter() - start
    assert outcome.counts.completed == items, outcome.message
    engine.dispose()
    return items / elapsed


def _floor_items(
    url: str, home: Path, items: int, concurrency: int, tag: str = ""
) -> tuple[str, list[int], int]:
    """A run with pending items to drive by raw SQL (set up through the project's API)."""
    from episodic.storage.engine import make_engine
    from tests.generation import Episode, new_run

    episode, pk = _episode(url, home, items, f"floor-c{concurrency}{tag}")
    engine = make_engine(url)
    run_id = new_run(Episode(engine, episode))
    with engine.connect() as conn:
        from sqlalchemy import text

        conn.execute(text("UPDATE runs SET state = 'running' WHERE id = :r"), {"r": run_id})
        conn.commit()
        item_pks = [
            row[0]
            for row in conn.execute(
                text("SELECT item_pk FROM run_items WHERE run_id = :r"), {"r": run_id}
            )
        ]
    engine.dispose()
    return run_id, item_pks, pk


def _connect(url: str) -> tuple[Any, str]:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        import sqlite3

        conn = sqlite3.connect(str(parsed.database), isolation_level=None, timeout=30)
        conn.execute("PRAGMA journal_mode=WAL")  # the project's own pragmas
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA foreign_keys=ON")
        return conn, "?"
    import psycopg

    return psycopg.connect(parsed.set(drivername="postgresql").render_as_string(False)), "%s"


def _write_atomically(path: Path, content: bytes) -> str:
    """The floor's image write: a temporary file renamed into place; returns its sha256."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_bytes(content)
    os.replace(tmp, path)
    return hashlib.sha256(content).hexdigest()


def floor_rate(url: str, home: Path, items: int, concurrency: int, tag: str = "") -> float:
    """Items per second for the same commits per item in raw SQL, `concurrency` threads."""
    run_id, item_pks, episode_pk = _floor_items(url, home, items, concurrency, tag)
    sqlite = make_url(url).get_backend_name() == "sqlite"
    queue = list(item_pks)
    guard = threading.Lock()

    from episodic.providers.base import ImageRequest
    from episodic.providers.fake import FakeProvider
    from episodic.storage.budgets import BUDGETS, PERIOD_SPEND, RUN_SPEND
    from episodic.storage.tx import advisory_key

    def sql(statement: Any) -> str:
        return str(statement.sqlite if sqlite else statement.pg)

    money_locks = sorted(advisory_key(n) for n in (f"spend:{run_id}", "budget:weekly"))
    week_start = datetime(2000, 1, 3, tzinfo=UTC)  # bounds as the engine computes them
    provider = FakeProvider(profile_id="fake", state_dir=home / f"floor-fake-{concurrency}{tag}")
    images = home / f"floor-images-{concurrency}{tag}"

    def worker() -> None:
        conn, p = _connect(url)
        owner = f"bench:{uuid.uuid4().hex[:8]}"

        def tx(statements: Callable[[Any], None]) -> None:
            if sqlite:
                conn.execute("BEGIN IMMEDIATE")
                statements(conn)
                conn.execute("COMMIT")
            else:
                with conn.transaction():
                    statements(conn)

        while True:
            with guard:
                if not queue:
                    break
                item = queue.pop()
            now = datetime.now(UTC).replace(tzinfo=None) if sqlite else datetime.now(UTC)
            lease = now + timedelta(seconds=30)
            ref = f"bench-{uuid.uuid4().hex}"
            sub: list[int] = []

            def claim(c: Any) -> None:
                for key in [] if sqlite else money_locks:
                    c.execute("SELECT pg_advisory_xact_lock(%s)", (key,))
                c.execute(f"SELECT state FROM runs WHERE id = {p}", (run_id,))
                c.execute(
                    f"SELECT * FROM items WHERE id = {p}" + ("" if sqlite else " FOR UPDATE"),
                    (item,),
                )
                c.execute(  # the provider's slots: live claims and recent open submissions
                    "SELECT count(*) FROM (SELECT id AS item FROM items WHERE claim_profile = "
                    f"'fake' AND state = 'running' AND lease_expires_at > {p} AND id != {p} "
                    "UNION SELECT item_pk FROM submissions WHERE provider_profile = 'fake' AND "
                    "(state = 'intent' OR state = 'unknown' OR state = 'accepted') AND "
                    f"created_at > {p} AND item_pk != {p}) AS slots",
                    (now, item, now - timedelta(seconds=60), item),
                )
                # the run's caps and the pipeline's budgets (`episodic.storage.budgets`)
                c.execute(sql(RUN_SPEND), {"b_run": run_id, "b_estimate": 40_000}).fetchone()
                for _period, _amount, currency, _tz in c.execute(
                    sql(BUDGETS), {"b_pipeline": "weekly"}
                ).fetchall():
                    start = week_start if not sqlite else week_start.replace(tzinfo=None)
                    c.execute(
                        sql(PERIOD_SPEND),
                        {
                            "b_pipeline": "weekly",
                            "b_currency": currency,
                            "b_start": start,
                            "b_end": start + timedelta(days=400_000),
                        },
                    ).fetchone()
                c.execute(
                    f"UPDATE items SET state = 'running', claim_owner = {p}, claim_run_id = {p}, "
                    f"claim_profile = 'fake', claim_token = {p}, lease_expires_at = {p}, "
                    f"started_at = {p}, attempts = attempts + 1 WHERE id = {p}",
                    (owner, run_id, uuid.uuid4().hex, lease, now, item),
                )
                cur = c.execute(
                    "INSERT INTO submissions (item_pk, run_id, attempt, client_reference, "
                    "provider_profile, state, forced, created_at, reserved_micros, currency) "
                    "VALUES ("  # the reference, and the reservation
                    f"{p}, {p}, 1, (SELECT id FROM installation WHERE singleton = 1) || '-' || "
                    f"{p}, 'fake', 'intent', {p}, {p}, 40000, 'USD') RETURNING id, "
                    "client_reference",
                    (item, run_id, ref, False, now),
                )
                sub.append(cur.fetchone()[0])

            def accept(c: Any) -> None:
                c.execute(
                    f"UPDATE submissions SET state = 'accepted', remote_ref = {p}, "
                    f"accepted_at = {p} WHERE id = {p} AND state = 'intent'",
                    (ref, now, sub[0]),
                )

            def complete(c: Any) -> None:  # outcome, cost and completion together
                c.execute(
                    f"UPDATE submissions SET state = 'succeeded', finished_at = {p} WHERE id = {p}",
                    (now, sub[0]),
                )
                c.execute(
                    f"UPDATE items SET state = 'completed', output_path = {p}, "
                    f"output_sha256 = {p}, finished_at = {p}, lease_expires_at = NULL "
                    f"WHERE id = {p} AND claim_owner = {p}",
                    (f"/tmp/{ref}.png", "0" * 64, now, item, owner),
                )
                c.execute(
                    "INSERT INTO cost_entries (episode_pk, submission_pk, amount_micros, "
                    "currency, basis, quantity, unit_price_micros, recorded_at) VALUES "
                    f"({p}, {p}, 40000, 'USD', 'per_image', 1, 40000, {p})",
                    (episode_pk, sub[0], now),
                )

            tx(claim)
            remote = provider.submit(ImageRequest(ref, "2026-W32-0", f"v{item}", "bench", item))
            tx(accept)
            result = provider.collect(remote, deadline_s=5, should_stop=lambda: False)
            _write_atomically(images / f"{ref}.png", result.content)
            tx(complete)
        conn.close()

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return len(item_pks) / (time.perf_counter() - start)


def _budget(url: str) -> None:
    """A weekly budget far above the bench's spend on pipeline weekly (both sides read it)."""
    from episodic.pipeline.pipelines import set_budget
    from episodic.storage.engine import make_engine
    from episodic.storage.schema import upgrade

    engine = make_engine(url)
    upgrade(engine)
    from episodic.core.settings import load_settings

    set_budget(engine, load_settings(), "weekly", "week", "999999.00")
    engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=400)
    parser.add_argument("--skip-postgres", action="store_true")
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="floor and engine measured alternately this many times; medians are compared "
        "(a machine whose speed drifts affects both sides alike)",
    )
    args = parser.parse_args()
    os.environ["EPISODIC_FAKE_DELAY_MS"] = "0"
    os.environ.pop("EPISODIC_FAKE_PROVIDER_LOG", None)
    print(
        f"ledger: {args.items} zero-latency items per figure, median of {args.rounds} "
        "alternating rounds (target >= 0.5x the floor)"
    )
    with tempfile.TemporaryDirectory(prefix="episodic-bench-ledger-") as tmp:
        backends: dict[str, Callable[[], str]] = {
            "sqlite": lambda: f"sqlite:///{Path(tmp) / 'sqlite' / 'episodic.db'}"
        }
        pg: Any = None
        if not args.skip_postgres:
            from tests.databases import PostgresDatabases

            pg = PostgresDatabases()
            name = pg.fresh(migrated=False)
            backends["postgres"] = lambda: pg.url(name)
        try:
            for backend, make in backends.items():
                url = make()
                home = Path(tmp) / backend
                home.mkdir(parents=True, exist_ok=True)
                os.environ["EPISODIC_HOME"] = str(home)
                os.environ["EPISODIC_DATABASE_URL"] = url
                _budget(url)
                for concurrency in (1, 8):
                    floors, engines = [], []
                    for n in range(args.rounds):
                        floors.append(floor_rate(url, home, args.items, concurrency, f"-r{n}"))
                        engines.append(engine_rate(url, home, args.items, concurrency, f"-r{n}"))
                    floor, ours = statistics.median(floors), statistics.median(engines)
                    print(
                        f"    {backend:8} {concurrency} at once: engine {ours:7.0f} items/s   "
                        f"raw-SQL floor {floor:7.0f} items/s   ratio {ours / floor:.2f}x"
                    )
        finally:
            if pg is not None:
                pg.drop(name)
                pg.close()


if __name__ == "__main__":
    main()
