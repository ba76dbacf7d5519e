"""Database faults: PostgreSQL connections terminated, the PostgreSQL server restarted,
SQLite's write lock held past the busy timeout."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

from sqlalchemy import make_url, text

from reliability.harness import (
    EPISODIC,
    PIPELINE,
    Backend,
    Result,
    fake_profiles,
    last_words,
    open_engine,
    record_allocations,
    recover_and_check,
    trial_env,
    trial_episode,
)


def _allocate_through_faults(url: str, prefix: str, out: Any) -> None:  # pragma: no cover
    """A forked child: allocate new keys until killed, reporting each allocation, and each
    error that survived the callers' own retries (tenacity) as ("error", text)."""
    from episodic.core.ids import WeekId
    from episodic.pipeline.allocation import allocate

    engine = open_engine(url)
    week = WeekId.parse("2026-W40")
    n = 0
    while True:
        key = f"{prefix}-{n}"
        try:
            out.send((key, str(allocate(engine, PIPELINE, week, key).episode.episode_id)))
            n += 1
        except Exception as exc:  # given up after its retries: the caller sees an error
            out.send(("error", f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"))
            time.sleep(0.05)


def pg_terminate(backend: Backend, trials: int, rng: random.Random) -> Result:
    """PostgreSQL connections killed with `pg_terminate_backend` (every 0.1-0.4 s, for 8 s)
    while 8 processes allocate and a generation runs: callers retry transient errors
    (tenacity), every allocation reported is in the database once, sequences have no gap or
    duplicate, and after the one recovery command the batch is complete, one provider job per
    item, no run left running."""
    url = backend.fresh()
    database = make_url(url).database

    def terminate(until: float, result: Result) -> None:
        with open_engine(url).connect() as admin:
            while time.monotonic() < until:
                time.sleep(rng.uniform(0.1, 0.4))
                result.faults["connections terminated"] += len(
                    admin.execute(
                        text(
                            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                            "datname = :d AND pid <> pg_backend_pid()"
                        ),
                        {"d": database},
                    ).all()
                )
                admin.commit()

    return _under_database_faults(
        Result("pg-terminate", backend.name),
        url,
        trials,
        rng,
        terminate,
        8.0,
        "a generation under pg_terminate_backend",
    )


def pg_restart(backend: Backend, trials: int, rng: random.Random) -> Result:
    """The PostgreSQL server itself restarted (a private cluster made for the scenario: 3
    restarts per trial, each a clean `fast` shutdown or an `immediate` one, a crash that
    recovers from WAL, down 0-2 s) while 8 processes allocate and a generation runs: callers
    retry transient errors (tenacity) through the outage, every allocation reported is in the
    database once, sequences have no gap or duplicate, and after the one recovery command the
    batch is complete, one provider job per item, no run left running."""
    from tests.pgcluster import PrivateCluster

    with PrivateCluster() as cluster:
        url = cluster.create_database("episodic_restart")

        def restart(until: float, result: Result) -> None:
            for _ in range(3):
                time.sleep(rng.uniform(0.5, 2.5))
                mode = rng.choice(["fast", "immediate"])
                cluster.restart(mode, rng.uniform(0.0, 2.0))
                result.faults[f"restarts ({mode})"] += 1
            time.sleep(max(0.0, until - time.monotonic()))

        return _under_database_faults(
            Result("pg-restart", backend.name),
            url,
            trials,
            rng,
            restart,
            12.0,
            "a generation across PostgreSQL restarts",
        )


def _under_database_faults(
    result: Result,
    url: str,
    trials: int,
    rng: random.Random,
    inject: Callable[[float, Result], None],
    seconds: float,
    fault: str,
) -> Result:
    """8 allocating processes and an `episodic generate` of a 6-item episode per trial, while
    `inject(until, result)` breaks the database until `until`; then the sweep, the recovery
    command and the checks of every allocation reported."""
    engine = open_engine(url)
    root = Path(tempfile.mkdtemp(prefix=f"episodic-reliability-{result.scenario}-"))
    profiles = fake_profiles(root, trials, delay_ms=2000)  # the generation lives through the faults
    context = multiprocessing.get_context("fork")
    reported: list[tuple[str, str]] = []
    gave_up: list[str] = []
    broken: list[str] = []
    for trial in range(trials):
        episode_id, _ = trial_episode(engine, root / f"pl{trial}", trial, 6, rng, profiles)
        engine.dispose()  # no pooled connection crosses the fork below
        home = root / f"home{trial}"
        home.mkdir(parents=True)
        env = trial_env(home, url, profiles)
        pipes, children = [], []
        for n in range(8):
            receive, send = context.Pipe(duplex=False)
            child = context.Process(
                target=_allocate_through_faults, args=(url, f"t{trial}p{n}", send), daemon=True
            )
            child.start()
            send.close()
            pipes.append(receive)
            children.append(child)
        batch = subprocess.Popen(
            [EPISODIC, "generate", episode_id, "--json", "--concurrency", "3"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        inject(time.monotonic() + seconds, result)
        time.sleep(1.0)  # the last outage's retries finish and report
        with suppress(subprocess.TimeoutExpired):
            out, err = batch.communicate(timeout=60)
            if batch.returncode != 0:  # the docs promise a batch rides the faults out
                said = last_words(out, err)
                broken.append(said)
                result.problem(
                    f"trial {trial}: the generation under the faults ended with exit "
                    f"{batch.returncode}: {said}"
                )
        for child in children:
            os.kill(child.pid or 0, signal.SIGKILL)
            child.join(30)
        for receive in pipes:
            with suppress(EOFError, OSError):
                while receive.poll():
                    key, answer = receive.recv()
                    if key == "error":
                        gave_up.append(answer)
                    else:
                        reported.append((key, answer))
        engine.dispose()  # the suite's own pooled connections were broken too
        result.faults["allocating processes"] += 8
        recover_and_check(
            result, threading.Lock(), engine, env, episode_id, 6, home, trial, [batch], fault
        )
    record_allocations(result, engine, reported)
    if gave_up:
        result.problem(f"{len(gave_up)} allocations failed after retries, e.g. {gave_up[0]}")
    result.notes = (
        f"{len(reported)} allocations reported under the faults; "
        f"{len(gave_up)} surfaced an error after the callers' retries; {len(broken)} of "
        f"{trials} generations ended with an error under the faults"
        + "".join(f"; one said: {line}" for line in sorted(set(broken)))
    )
    engine.dispose()
    return result


_HOLD_THE_LOCK = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.read()  # held until the suite closes our stdin: past every blocked command
conn.execute("ROLLBACK")
"""


def sqlite_locked(backend: Backend, trials: int, rng: random.Random) -> Result:
    """Another process holds SQLite's write lock until `episodic allocate` and `episodic
    generate`, started meanwhile, have given up after the busy timeout (30 s): each ends with
    one clear line (exit 1, "database is locked"), `PRAGMA integrity_check` is ok, nothing is
    half-written, and both succeed once the lock is gone."""
    from episodic.storage.engine import SQLITE_BUSY_TIMEOUT_MS

    result = Result("sqlite-locked", backend.name)
    url = backend.fresh()
    engine = open_engine(url)
    path = url.removeprefix("sqlite:///")
    reported: list[tuple[str, str]] = []
    root = Path(tempfile.mkdtemp(prefix="episodic-reliability-locked-"))
    profiles = fake_profiles(root, trials)
    wait_s = SQLITE_BUSY_TIMEOUT_MS / 1000
    for trial in range(trials):
        episode_id, _ = trial_episode(engine, root / f"pl{trial}", trial, 3, rng, profiles)
        home = root / f"home{trial}"
        home.mkdir(parents=True)
        env = trial_env(home, url, profiles)
        holder = subprocess.Popen(
            [sys.executable, "-c", _HOLD_THE_LOCK, path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        result.faults["write lock held past the busy timeout"] += 1
        commands = {
            "allocate": [EPISODIC, "allocate", "--key", f"locked-{trial}", "--week", "2026-W41"],
            "generate": [EPISODIC, "generate", episode_id, "--json"],
        }
        blocked = {
            name: subprocess.Popen(
                command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            for name, command in commands.items()
        }
        for name, process in blocked.items():
            _, err = process.communicate(timeout=wait_s + 120)
            lines = err.strip().splitlines()
            clear = process.returncode == 1 and len(lines) == 1 and "locked" in lines[0]
            if not clear:
                result.problem(
                    f"trial {trial}: {name} under a held lock: exit "
                    f"{process.returncode}, {err.strip()[-300:]!r}"
                )
        assert holder.stdin is not None
        holder.stdin.close()  # the lock is released only now
        holder.wait(timeout=60)
        with engine.connect() as conn:
            integrity = conn.execute(text("PRAGMA integrity_check")).scalar_one()
        if integrity != "ok":
            result.problem(f"trial {trial}: integrity_check: {integrity}")
        after = subprocess.run(
            [EPISODIC, "allocate", "--key", f"locked-{trial}", "--week", "2026-W41"],
            env=env,
            capture_output=True,
            text=True,
        )
        if after.returncode != 0:
            result.problem(f"trial {trial}: allocate after the lock: {after.stderr.strip()}")
        else:
            reported.append((f"locked-{trial}", after.stdout.split()[0]))
        recover_and_check(
            result,
            threading.Lock(),
            engine,
            env,
            episode_id,
            3,
            home,
            trial,
            [],
            "a generation after the lock",
        )
    record_allocations(result, engine, reported)
    result.notes = f"the busy timeout is {SQLITE_BUSY_TIMEOUT_MS / 1000:.0f} s"
    engine.dispose()
    return result
