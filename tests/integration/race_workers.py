"""Worker functions for the race tests, run in separate OS processes (spawn) released together
by a `multiprocessing.Barrier`. Each returns plain data through a queue; exceptions are
returned as text so the parent can assert that nobody crashed."""

from __future__ import annotations

import time
import traceback
from pathlib import Path
from typing import Any


def _engine(url: str) -> Any:
    from episodic.storage.engine import make_engine

    return make_engine(url)


def claim_worker(
    barrier: Any, url: str, home: str, trials: list[tuple[int, str]], results: Any
) -> None:
    """Per trial: claim one item of a running run; the winner makes the paid call."""
    from episodic.core.runs import Claim
    from episodic.pipeline.runner import new_owner
    from episodic.providers.base import ImageRequest
    from episodic.providers.fake import FakeProvider
    from episodic.storage.claims import ClaimStore

    claims = ClaimStore(_engine(url))
    provider = FakeProvider(profile_id="fake", state_dir=Path(home) / "fake-provider")
    owner = new_owner()
    out: list[Any] = []
    for item_pk, run_id in trials:
        barrier.wait(timeout=120)
        try:
            got = claims.claim(item_pk, run_id, owner, lease_s=30, max_attempts=3, profile="fake")
            if isinstance(got, Claim):
                if got.action == "submit":
                    assert got.submission is not None
                    item = got.item
                    provider.submit(
                        ImageRequest(
                            got.submission.client_reference,
                            "e",
                            item.item_id,
                            item.prompt,
                            item.seed,
                        )
                    )
                out.append([item_pk, got.action])
            else:
                out.append([item_pk, got.reason])
        except Exception:
            out.append([item_pk, "error: " + traceback.format_exc(limit=3)])
    results.put(out)


def generate_worker(
    barrier: Any,
    url: str,
    episode_ids: list[str],
    mode: str,
    results: Any,
    dedup: dict[str, Any] | None = None,
) -> None:
    """Per trial: a whole `generate` (or a resume of the given run) of one episode."""
    from tests.generation import Episode

    engine = _engine(url)
    out: list[Any] = []
    for target in episode_ids:
        barrier.wait(timeout=120)
        try:
            if mode == "resume" and ":" in target:
                episode_id, run_id = target.split(":", 1)
                outcome = Episode(engine, episode_id).resume(run_id)
            else:
                outcome = Episode(engine, target.split(":", 1)[0]).generate(lease_s=5, dedup=dedup)
            out.append(
                [
                    target,
                    outcome.state.value,
                    int(outcome.exit_code),
                    outcome.run_id,
                    outcome.deduplicated,
                ]
            )
        except Exception:
            out.append([target, "error: " + traceback.format_exc(limit=5), -1, None])
    results.put(out)


def generate_with(
    barrier: Any, url: str, episode_ids: list[str], dedup: dict[str, Any], results: Any
) -> None:
    """`generate_worker` with dedup options (idempotency_key, batch_id, allow_duplicate)."""
    generate_worker(barrier, url, episode_ids, "generate", results, dedup)


def run_worker(barrier: Any, url: str, episode_id: str, run_id: str, results: Any) -> None:
    """Execute an existing run (as `runs resume` does) and report its outcome."""
    from tests.generation import Episode

    engine = _engine(url)
    barrier.wait(timeout=120)
    try:
        outcome = Episode(engine, episode_id).resume(run_id)
        results.put(["run", outcome.state.value, int(outcome.exit_code), time.time()])
    except Exception:
        results.put(["run", "error: " + traceback.format_exc(limit=5), -1, time.time()])


def cancel_worker(barrier: Any, url: str, run_id: str, delay_s: float, results: Any) -> None:
    """Cancel the run `delay_s` after the release, as `episodic runs cancel` does."""
    from episodic.core.states import RunState
    from episodic.storage.runs import RunStore

    store = RunStore(_engine(url))
    barrier.wait(timeout=120)
    time.sleep(delay_s)
    try:
        store.transition_run(run_id, RunState.CANCELLED, "cancelled by operator")
        results.put(["cancel", "ok", 0, time.time()])
    except Exception as exc:
        results.put(["cancel", f"error: {exc}", -1, time.time()])


def decide_worker(
    barrier: Any, url: str, episode_ids: list[str], approve: bool, results: Any
) -> None:
    """Per trial: approve (or reject) one generated episode at the same moment as another."""
    from episodic.core.errors import CommandNotAllowed
    from episodic.pipeline.approval import decide

    engine = _engine(url)
    out: list[Any] = []
    for episode_id in episode_ids:
        barrier.wait(timeout=120)
        try:
            result = decide(
                engine,
                "weekly",
                episode_id,
                approve=approve,
                by="ann" if approve else "bob",
                note=None if approve else "no",
            )
            out.append([episode_id, "recorded" if result["changed"] else "no-op"])
        except CommandNotAllowed:
            out.append([episode_id, "refused"])
        except Exception:
            out.append([episode_id, "error: " + traceback.format_exc(limit=3)])
    results.put(out)


def run_processes(targets: list[tuple[Any, tuple[Any, ...]]], timeout: float = 300) -> list[Any]:
    """Start one spawned process per (function, args), all sharing one barrier; collect."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(len(targets))
    results = ctx.Queue()
    processes = [
        ctx.Process(target=fn, args=(barrier, *args, results), daemon=True) for fn, args in targets
    ]
    for process in processes:
        process.start()
    collected: list[Any] = []
    deadline = time.monotonic() + timeout
    for _ in processes:
        collected.append(results.get(timeout=max(1.0, deadline - time.monotonic())))
    for process in processes:
        process.join(timeout=30)
        assert process.exitcode == 0, f"worker exited with {process.exitcode}"
    return collected


def admit_worker(
    barrier: Any,
    url: str,
    home: str,
    episode_id: str,
    threads: int,
    dedup: dict[str, Any],
    results: Any,
) -> None:
    """`threads` callers in this process ask the choke point for the same generate request
    (no execution): the dedup decision alone, released with every other process."""
    import os
    import threading

    os.environ["EPISODIC_HOME"] = home
    os.environ["EPISODIC_DATABASE_URL"] = url
    from episodic.storage.engine import make_engine
    from tests.generation import admit

    # Postgres allows 100 sessions here: 200 callers share 2 connections per process, as
    # callers behind a pool (or PgBouncer) do.
    pool: dict[str, Any] = {} if url.startswith("sqlite") else {"pool_size": 2, "max_overflow": 0}
    engine = make_engine(url, **pool)
    inner = threading.Barrier(threads)
    out: list[Any] = []
    guard = threading.Lock()

    def ask() -> None:
        inner.wait(timeout=120)
        try:
            got = admit(engine, episode_id, **dedup)
            row = [got.run_id, got.deduplicated]
        except Exception:
            row = [None, "error: " + traceback.format_exc(limit=3)]
        with guard:
            out.append(row)

    barrier.wait(timeout=120)
    workers = [threading.Thread(target=ask) for _ in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    results.put(out)


def cli_generate(home: str, url: str, episode_id: str, *extra: str, env: dict[str, str]) -> Any:
    """Start `episodic generate` as a real process (for SIGTERM / kill -9 tests)."""
    import os
    import subprocess
    import sys

    bin_dir = Path(sys.executable).parent
    return subprocess.Popen(
        [str(bin_dir / "episodic"), "generate", episode_id, "--json", *extra],
        env={**os.environ, "EPISODIC_HOME": home, "EPISODIC_DATABASE_URL": url, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def sweep_worker(barrier: Any, url: str, home: str, results: Any) -> None:
    """One `episodic sweep`, released together with the others."""
    import os

    os.environ["EPISODIC_HOME"] = home
    from episodic.core.settings import load_settings
    from episodic.pipeline.sweep import sweep

    engine = _engine(url)
    settings = load_settings()
    barrier.wait(timeout=120)
    try:
        report = sweep(engine, settings)
        results.put({k: [str(x) for x in v] for k, v in report.moved.items()})
    except Exception:
        results.put({"error": [traceback.format_exc(limit=5)]})


def timezone_worker(barrier: Any, url: str, pipeline: str, zone: str, results: Any) -> None:
    """First use of a pipeline's timezone from a process with EPISODIC_TIMEZONE=zone."""
    import os

    from episodic.core.errors import TimezoneMismatch
    from episodic.core.settings import Settings
    from episodic.pipeline.pipelines import pipeline_config

    os.environ["EPISODIC_TIMEZONE"] = zone
    engine = _engine(url)
    barrier.wait()
    try:
        config = pipeline_config(engine, Settings(), pipeline)
        results.put(("ok", config.timezone, zone))
    except TimezoneMismatch as exc:
        results.put(("refused", str(exc), zone))
    finally:
        engine.dispose()


def lock_order_worker(
    barrier: Any,
    url: str,
    run_id: str,
    owner: str,
    role: str,
    pks: list[int],
    rounds: int,
    results: Any,
) -> None:
    """Per barrier-released trial (3), `rounds` times: ``claim`` the items `pks` in one
    batch, in the order given (a dispatcher filling its free slots), or ``renew`` every claim
    of `owner` (a heartbeat). Returns the errors seen (a deadlock aborts one of the
    transactions in it)."""
    from episodic.storage.claims import ClaimStore
    from episodic.storage.leases import LeaseStore

    engine = _engine(url)
    claims, leases = ClaimStore(engine), LeaseStore(engine)
    errors: list[str] = []
    for _ in range(3):
        barrier.wait(timeout=120)
        for _ in range(rounds):
            try:
                if role == "claim":
                    claims.claim_many(
                        [(pk, True) for pk in pks],
                        run_id,
                        owner,
                        lease_s=60,
                        max_attempts=1000,
                        profile="fake",
                    )
                else:
                    leases.renew(owner, run_id, 60)
            except Exception as exc:
                errors.append(f"{role}: {type(exc).__name__}: {str(exc).splitlines()[0]}")
    results.put(errors)


def membership_worker(
    barrier: Any, url: str, home: str, episode_id: str, role: str, trials: int, results: Any
) -> None:
    """Per trial, four barrier phases. ``cancel``: admit run A over every planned item
    (cancelled items start over), then, released with the creators, cancel A. ``create``:
    released with the cancel, admit a run of its own (its own idempotency key, so its own
    fingerprint: nothing but the database serializes it with the others); once everyone
    is done, read the states of its run's items, then cancel its run. Returns
    ``{"errors": [...], "cancelled_in_live_run": [[trial, item states], ...]}``."""
    import os

    os.environ["EPISODIC_HOME"] = home
    os.environ["EPISODIC_DATABASE_URL"] = url
    from sqlalchemy import select

    from episodic.core.states import ItemState, RunState
    from episodic.storage.models import ItemRow, RunItemRow
    from episodic.storage.runs import RunStore
    from tests.generation import admit

    engine = _engine(url)
    runs = RunStore(engine)
    errors: list[str] = []
    wrong: list[Any] = []
    for trial in range(trials):
        mine: str | None = None
        try:
            barrier.wait(timeout=120)
            if role == "cancel":
                mine = admit(engine, episode_id, allow_duplicate=True).run_id
            barrier.wait(timeout=120)
            if role == "cancel":
                assert mine is not None
                runs.transition_run(mine, RunState.CANCELLED)
            else:
                key = f"race-{os.getpid()}-{trial}"
                mine = admit(engine, episode_id, idempotency_key=key).run_id
            barrier.wait(timeout=120)
            if role == "create" and mine is not None:
                with engine.connect() as conn:
                    states = sorted(
                        conn.execute(
                            select(ItemRow.state)
                            .join(RunItemRow, RunItemRow.item_pk == ItemRow.id)
                            .where(RunItemRow.run_id == mine)
                        ).scalars()
                    )
                if ItemState.CANCELLED in states:
                    wrong.append([trial, states])
                runs.transition_run(mine, RunState.CANCELLED)
            barrier.wait(timeout=120)
        except Exception as exc:
            errors.append(f"{role} trial {trial}: {type(exc).__name__}: {str(exc)[:300]}")
            barrier.abort()  # the others stop at their next phase (BrokenBarrierError)
            break
    results.put({"errors": errors, "cancelled_in_live_run": wrong})


def renew_or_admit_worker(
    barrier: Any,
    url: str,
    home: str,
    episode_id: str,
    run_id: str,
    owner: str,
    role: str,
    seconds: float,
    results: Any,
) -> None:
    """For `seconds` after the barrier: ``renew`` the owner's claims over and over (a
    heartbeat), or ``admit`` a new run of the episode over and over (each with its own
    idempotency key). Returns ``{"done": n, "errors": [...]}``."""
    import os

    os.environ["EPISODIC_HOME"] = home
    os.environ["EPISODIC_DATABASE_URL"] = url
    from episodic.storage.leases import LeaseStore
    from tests.generation import admit

    engine = _engine(url)
    leases = LeaseStore(engine)
    done, errors = 0, []
    barrier.wait(timeout=120)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            if role == "renew":
                leases.renew(owner, run_id, 600)
            else:
                admit(engine, episode_id, idempotency_key=f"k-{os.getpid()}-{done}")
            done += 1
        except Exception as exc:
            errors.append(f"{role}: {type(exc).__name__}: {str(exc)[:200]}")
    results.put({"done": done, "errors": errors})


def upgrade_worker(barrier: Any, url: str, home: str, results: Any) -> None:
    """`episodic db upgrade` (in this process) at the barrier; report the line it printed."""
    import contextlib
    import io
    import os

    os.environ["EPISODIC_HOME"] = home
    os.environ["EPISODIC_DATABASE_URL"] = url
    from episodic.cli.app import run

    out = io.StringIO()
    barrier.wait(timeout=120)
    with contextlib.redirect_stdout(out):
        code = run(["db", "upgrade"])
    results.put([code, out.getvalue().strip()])
