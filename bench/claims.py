"""Claiming overhead against the bookkeeping rate of the same database, same run.

For each backend (SQLite: a temp file under a temp EPISODIC_HOME; Postgres: a throwaway
database created on the local server, migrated with `episodic.storage.schema.upgrade` and dropped at
the end), in one run:

1. baseline: the raw rate of single-row committed inserts into a scratch table of the same
   database (`_raw_insert_rate`: one raw sqlite3 / psycopg connection, one
   INSERT + COMMIT per row), items/s;
2. claim cycles, no provider: `ClaimStore.claim` (item locked, run checked, claim and
   submission intent committed) + `accept` (a fixed fake remote ref per item) + `complete`
   (a tiny fake output path and sha256, cost entry) for `--items` items of one running run,
   with 1 process and with 8 processes on the same episode and run, all walking the same item
   list in the same order and skipping what they cannot claim (`busy`, `done`). Spawned
   processes are connected before a `multiprocessing.Barrier` releases them; the time is from
   the release to the last process done. Checked afterwards: every item completed, each with
   exactly one submission, which succeeded, and one cost entry (none completed twice);
3. the ratio claim-cycle rate / baseline rate, and the time per item in ms next to the
   baseline's time per insert (the difference is the claiming overhead per item);
4. the whole engine with the zero-latency fake provider: `generate` (plan, create the run,
   execute it at concurrency 8; tests.generation.Episode.generate) of an episode of `--images`
   images in 1 process, and 8 processes generating one other such episode at once (spawned,
   barrier). Checked from the fake provider's own log (EPISODIC_FAKE_PROVIDER_LOG): each item
   got exactly one `job_created` event; and in the database as in 2.

The `ratio` column divides by the single-connection baseline, 8-process rows included.
Errors in workers (e.g. SQLite "database is locked") are counted and printed, never hidden.
A benchmark, never a test: nothing here asserts a timing.

Run: make bench  (or .venv/bin/python -m bench.claims [--skip-postgres] [--items N] [--images N])
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PROCESSES = (1, 8)
ENGINE_CONCURRENCY = 8  # threads per generating process, as bench.batch (b)
LEASE_S = 300.0  # no claim expires during a measurement
FAKE_SHA = "0" * 64


# ---------------------------------------------------------------- workers (child processes)
def _error_text(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def _claim_worker(
    barrier: Any, url: str, run_id: str, episode_pk: int, item_pks: list[int], results: Any
) -> None:
    """Walk the items: claim, accept, complete what this process gets; skip refusals."""
    from sqlalchemy import text

    from episodic.core.media import StoredMedia, content_key
    from episodic.core.pricing import Price
    from episodic.core.runs import Claim
    from episodic.pipeline.runner import new_owner
    from episodic.storage.claims import ClaimStore
    from episodic.storage.engine import make_engine
    from episodic.storage.ledger import LedgerStore

    engine = make_engine(url)
    with engine.connect() as conn:  # connect outside the clock
        conn.execute(text("SELECT 1"))
    claims = ClaimStore(engine)
    ledger = LedgerStore(engine)
    owner = new_owner()
    tally: Counter[str] = Counter()
    errors: list[str] = []
    barrier.wait(timeout=180)
    start = time.monotonic()
    for pk in item_pks:
        try:
            got = claims.claim(pk, run_id, owner, lease_s=LEASE_S, max_attempts=3, profile="fake")
            if not isinstance(got, Claim):
                tally[got.reason] += 1
                continue
            if got.action != "submit" or got.submission is None:
                tally[f"claimed for {got.action}"] += 1
                continue
            sub = got.submission
            if not ledger.accept(sub.pk, f"bench-job-{pk}"):
                tally["accept refused"] += 1
                continue
            image = StoredMedia(content_key(FAKE_SHA, "image/png"), FAKE_SHA, 1, "image/png")
            done = ledger.complete(
                got, sub.pk, episode_pk, image, Price("per_image", 1, "USD", 1).charge(1)
            )
            tally["completed" if done else "complete refused"] += 1
        except Exception as exc:
            tally["error"] += 1
            if len(errors) < 3:
                errors.append(_error_text(exc))
    end = time.monotonic()
    engine.dispose()
    results.put({"start": start, "end": end, "tally": dict(tally), "errors": errors})


def _generate_worker(barrier: Any, url: str, episode_id: str, results: Any) -> None:
    """One whole `generate` of the episode (its own run; claims split the items)."""
    from sqlalchemy import text

    from episodic.providers.fake import render_png
    from episodic.storage.engine import make_engine
    from tests.generation import Episode

    engine = make_engine(url)
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))
    render_png("warm-up", 1)  # import Pillow outside the clock
    barrier.wait(timeout=180)
    start = time.monotonic()
    result: dict[str, Any]
    try:
        outcome = Episode(engine, episode_id).generate(concurrency=ENGINE_CONCURRENCY)
        result = {
            "state": outcome.state.value,
            "exit_code": int(outcome.exit_code),
            "paid": outcome.counts.paid_submissions,
            "errors": [],
        }
    except Exception as exc:
        result = {"state": "error", "exit_code": -1, "paid": 0, "errors": [_error_text(exc)]}
    result.update(start=start, end=time.monotonic())
    engine.dispose()
    results.put(result)


# ---------------------------------------------------------------- driver
@dataclass
class Row:
    backend: str
    scenario: str
    processes: int
    items: int
    seconds: float
    check: str = "ok"
    notes: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.items / self.seconds if self.seconds > 0 else 0.0


def _spawn(targets: list[tuple[Any, tuple[Any, ...]]]) -> tuple[float, list[dict[str, Any]]]:
    """Run the workers released together; seconds from the release to the last one done."""
    from tests.integration.race_workers import run_processes

    results = run_processes(targets, timeout=600)
    seconds = max(r["end"] for r in results) - min(r["start"] for r in results)
    return seconds, results


def _new_episode(engine: Any, home: Path, key: str, count: int) -> Any:
    from tests.generation import new_episode, write_playlist

    episode = new_episode(engine, key)
    episode.plan(write_playlist(home / key, [f"{key} video {n}" for n in range(1, count + 1)]))
    return episode


def _running_run(episode: Any) -> tuple[str, int, list[int]]:
    """A run of every planned item, moved to running (as tests/integration/test_races.py)."""
    from episodic.core.states import ItemState, RunState
    from episodic.storage.episodes import EpisodeRepository
    from episodic.storage.runs import RunStore
    from tests.generation import new_run

    store = RunStore(episode.engine)
    episodes = EpisodeRepository(episode.engine)
    run_id = new_run(episode)
    store.transition_run(run_id, RunState.RUNNING)
    pks = sorted(item.pk for item in store.run_items(run_id, [ItemState.PENDING]))
    return run_id, episodes.episode_pk("weekly", episode.episode_id), pks


def _ledger_check(engine: Any, episode_pk: int, expected: int) -> list[str]:
    """Every item completed, with exactly one submission (succeeded) and one cost entry."""
    from sqlalchemy import func, select

    from episodic.storage.models import CostEntryRow, ItemRow, SubmissionRow

    with engine.connect() as conn:
        states = Counter(
            {
                str(state): int(n)
                for state, n in conn.execute(
                    select(ItemRow.state, func.count())
                    .where(ItemRow.episode_pk == episode_pk)
                    .group_by(ItemRow.state)
                )
            }
        )
        subs = conn.execute(
            select(SubmissionRow.item_pk, SubmissionRow.state)
            .join(ItemRow, ItemRow.id == SubmissionRow.item_pk)
            .where(ItemRow.episode_pk == episode_pk)
        ).all()
        costs = conn.execute(
            select(func.count())
            .select_from(CostEntryRow)
            .where(CostEntryRow.episode_pk == episode_pk)
        ).scalar_one()
    problems = []
    if states != Counter({"completed": expected}):
        problems.append(f"item states {dict(states)}")
    succeeded = Counter(pk for pk, state in subs if state == "succeeded")
    twice = sum(1 for n in succeeded.values() if n > 1)
    if twice:
        problems.append(f"{twice} items with >1 succeeded submission")
    if len(succeeded) != expected:
        problems.append(f"{expected - len(succeeded)} items without a succeeded submission")
    other = Counter(state for _, state in subs if state != "succeeded")
    if other:
        problems.append(f"other submissions {dict(other)}")
    if costs != expected:
        problems.append(f"{costs} cost entries for {expected} items")
    return problems


def _job_check(log: Path, expected: int) -> list[str]:
    """From the fake provider's own log: one `job_created` per item (idempotency key)."""
    from tests.generation import jobs_per_key

    os.environ["EPISODIC_FAKE_PROVIDER_LOG"] = str(log)
    jobs = jobs_per_key()
    problems = []
    if len(jobs) != expected:
        problems.append(f"job_created for {len(jobs)} of {expected} items")
    twice = sum(1 for n in jobs.values() if n > 1)
    if twice:
        problems.append(f"{twice} items with >1 job_created")
    return problems


def _summarise(results: list[dict[str, Any]]) -> list[str]:
    notes = []
    errors = [e for r in results for e in r.get("errors", [])]
    if errors:
        notes.append(f"errors ({len(errors)} shown, first per worker): " + " | ".join(errors))
    return notes


def bench_claims(backend: str, url: str, engine: Any, home: Path, items: int) -> list[Row]:
    rows = []
    for processes in PROCESSES:
        episode = _new_episode(engine, home, f"claims-{processes}", items)
        run_id, episode_pk, pks = _running_run(episode)
        assert len(pks) == items, len(pks)
        seconds, results = _spawn(
            [(_claim_worker, (url, run_id, episode_pk, pks)) for _ in range(processes)]
        )
        tally: Counter[str] = Counter()
        for r in results:
            tally.update(r["tally"])
        problems = _ledger_check(engine, episode_pk, items)
        row = Row(backend, "claim+accept+complete", processes, tally["completed"], seconds)
        row.check = "ok" if not problems else "; ".join(problems)
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(tally.items()))
        split = [r["tally"].get("completed", 0) for r in results]
        row.notes = [
            f"claim outcomes: {outcomes}; completed per process {split}",
            *_summarise(results),
        ]
        rows.append(row)
    return rows


def bench_engine(backend: str, url: str, engine: Any, home: Path, images: int) -> list[Row]:
    from sqlalchemy import select

    from episodic.storage.models import EpisodeRow

    rows = []
    for processes in PROCESSES:
        episode = _new_episode(engine, home, f"engine-{processes}", images)
        log = home / f"provider-{processes}.jsonl"
        os.environ["EPISODIC_FAKE_PROVIDER_LOG"] = str(log)  # inherited by the spawned workers
        try:
            seconds, results = _spawn(
                [(_generate_worker, (url, episode.episode_id)) for _ in range(processes)]
            )
        finally:
            os.environ.pop("EPISODIC_FAKE_PROVIDER_LOG", None)
        with engine.connect() as conn:
            episode_pk = conn.execute(
                select(EpisodeRow.id).where(EpisodeRow.episode_id == episode.episode_id)
            ).scalar_one()
        problems = _job_check(log, images) + _ledger_check(engine, episode_pk, images)
        os.environ.pop("EPISODIC_FAKE_PROVIDER_LOG", None)
        row = Row(backend, "engine generate (fake, 0 ms)", processes, images, seconds)
        row.check = "ok" if not problems else "; ".join(problems)
        runs = Counter(f"{r['state']}/exit {r['exit_code']}" for r in results)
        paid = [r["paid"] for r in results]
        row.notes = [
            f"runs: {', '.join(f'{n}x {k}' for k, n in sorted(runs.items()))}; "
            f"paid calls per process {paid}",
            *_summarise(results),
        ]
        rows.append(row)
    return rows


@contextmanager
def _sqlite(tmp: Path) -> Iterator[str]:
    home = tmp / "sqlite"
    home.mkdir()
    yield f"sqlite:///{home / 'episodic.db'}"


@contextmanager
def postgres_database(purpose: str = "claims") -> Iterator[str]:
    """A fresh database on the local server for one bench run, dropped afterwards."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    from tests.databases import pg_admin_url, require_postgres_or_reason

    reason = require_postgres_or_reason()
    if reason:
        raise SystemExit(f"postgres: {reason} (use --skip-postgres)")
    name = f"episodic_bench_{purpose}_{uuid.uuid4().hex[:10]}"
    admin = create_engine(pg_admin_url(), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(pg_admin_url()).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _raw_insert_rate(url: str, rows: int) -> float:
    """Single-row committed inserts per second through the bare driver (the baseline)."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        import sqlite3

        Path(str(parsed.database)).parent.mkdir(parents=True, exist_ok=True)
        conn: Any = sqlite3.connect(str(parsed.database), isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS bench_raw (id INTEGER PRIMARY KEY, k TEXT, v TEXT)"
        )
        start = time.perf_counter()
        for n in range(rows):
            conn.execute("BEGIN")
            conn.execute("INSERT INTO bench_raw (k, v) VALUES (?, ?)", (f"k{n}", "x" * 64))
            conn.execute("COMMIT")
        return rows / (time.perf_counter() - start)
    import psycopg

    with psycopg.connect(
        parsed.set(drivername="postgresql").render_as_string(hide_password=False)
    ) as pg:
        pg.execute(
            "CREATE TABLE IF NOT EXISTS bench_raw (id bigserial PRIMARY KEY, k text, v text)"
        )
        pg.commit()
        start = time.perf_counter()
        for n in range(rows):
            pg.execute("INSERT INTO bench_raw (k, v) VALUES (%s, %s)", (f"k{n}", "x" * 64))
            pg.commit()
        return rows / (time.perf_counter() - start)


def bench_backend(backend: str, url: str, home: Path, items: int, images: int) -> list[Row]:
    from episodic.storage.engine import make_engine
    from episodic.storage.schema import upgrade

    home.mkdir(parents=True, exist_ok=True)
    os.environ.update(
        EPISODIC_HOME=str(home), EPISODIC_DATABASE_URL=url, EPISODIC_FAKE_DELAY_MS="0"
    )
    os.environ.pop("EPISODIC_FAKE_PROVIDER_LOG", None)
    engine = make_engine(url)
    upgrade(engine)
    raw = _raw_insert_rate(url, items)
    rows = [Row(backend, "baseline: raw 1-row insert+commit", 1, items, items / raw)]
    print(f"  {backend}: baseline {raw:.0f}/s", flush=True)
    for row in bench_claims(backend, url, engine, home, items):
        rows.append(row)
        print(f"  {backend}: claims x{row.processes} {row.rate:.0f}/s", flush=True)
    for row in bench_engine(backend, url, engine, home, images):
        rows.append(row)
        print(f"  {backend}: engine x{row.processes} {row.rate:.0f}/s", flush=True)
    engine.dispose()
    return rows


def print_table(rows: list[Row]) -> None:
    header = (
        f"{'backend':9} {'scenario':34} {'procs':>5} {'items':>6} {'seconds':>8} "
        f"{'items/s':>8} {'ratio':>6} {'ms/item':>8} {'+ms':>7}  check"
    )
    print("\n" + header)
    print("-" * len(header))
    baseline: dict[str, Row] = {}
    for row in rows:
        if row.scenario.startswith("baseline"):
            baseline[row.backend] = row
        base = baseline[row.backend]
        ms = 1000 / row.rate if row.rate else float("inf")
        extra = ms - 1000 / base.rate
        print(
            f"{row.backend:9} {row.scenario:34} {row.processes:>5} {row.items:>6} "
            f"{row.seconds:>8.2f} {row.rate:>8.0f} {row.rate / base.rate:>6.3f} {ms:>8.3f} "
            f"{extra:>+7.3f}  {row.check}"
        )
    print(
        "\nratio = items/s / baseline items/s (same database, same run); ms/item = 1000 / "
        "items/s (wall time per item, all processes together); +ms = ms/item minus the "
        "baseline's ms per insert: the claiming (or engine) overhead per item."
    )
    notes = [(row, note) for row in rows for note in row.notes]
    if notes:
        print("\nnotes")
        for row, note in notes:
            print(f"  {row.backend} {row.scenario} x{row.processes}: {note}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--skip-postgres", action="store_true")
    parser.add_argument("--items", type=int, default=2000, help="items of the claim scenarios")
    parser.add_argument("--images", type=int, default=500, help="images of the engine scenarios")
    args = parser.parse_args()
    os.chdir(ROOT)
    print(
        f"claims: {args.items} items of claim cycles and {args.images} images through "
        f"the engine, with {' and '.join(map(str, PROCESSES))} processes on one episode"
    )
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="episodic-claims-") as name:
        tmp = Path(name)
        with _sqlite(tmp) as url:
            rows += bench_backend("sqlite", url, tmp / "sqlite", args.items, args.images)
        if not args.skip_postgres:
            with postgres_database() as url:
                rows += bench_backend("postgres", url, tmp / "postgres", args.items, args.images)
    print_table(rows)


if __name__ == "__main__":
    main()
