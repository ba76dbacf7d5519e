"""Recovery collects first, whatever the budget: a resume or retry of a run whose processes
died (kill -9) or were stopped (SIGTERM) with jobs accepted at the provider collects those
jobs before it decides anything about buying, even when the period budget is exhausted, and
its closing line says only what happened. Counted at the provider's side: the fake's job
store (one file per job it really made, which a kill cannot hide) and its price."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from episodic.core.planning import RunLimits
from episodic.core.pricing import Reservation
from episodic.core.records import ClaimAction, RefusalReason
from episodic.core.runs import Claim, Refusal
from episodic.core.states import RunState
from episodic.storage.budgets import Guard
from episodic.storage.claims import ClaimStore
from episodic.storage.leases import LeaseStore
from episodic.storage.ledger import LedgerStore
from episodic.storage.runs import RunStore
from tests.acceptance.conftest import EPISODIC
from tests.generation import (
    jobs_of_process,
    made_jobs_per_key,
    new_episode,
    new_run,
    outstanding_of_process,
    signal_storm,
    write_playlist,
)
from tests.integration.paid_episodes import ledger_micros, planned_episodes

pytestmark = pytest.mark.slow

PRICE_MICROS = 100_000
EPISODES = 8
ITEMS = 3


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    assert EPISODIC is not None
    return subprocess.run(
        [EPISODIC, *args], capture_output=True, text=True, timeout=300, env=os.environ.copy()
    )


def _profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Profile ``paid``: the fake at 0.10 an image, each job 1.5 s at the provider (so a
    killed process leaves accepted jobs behind)."""
    path = tmp_path / "providers.yaml"
    path.write_text(
        'profiles:\n  paid:\n    kind: fake\n    price: {per_image: "0.10"}\n'
        "    max_concurrency: 64\n    delay_ms: 1500\n"
    )
    monkeypatch.setenv("EPISODIC_PROVIDERS_FILE", str(path))
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))
    monkeypatch.setenv("EPISODIC_LEASE_S", "5")


def _bill() -> int:
    """What the fake billed: every job it holds, at its price (a kill between a job's
    creation and its log line leaves a job its log does not show, never one its store
    does not hold)."""
    return sum(made_jobs_per_key().values()) * PRICE_MICROS


def _episodes(engine: Engine, folder: Path, count: int = EPISODES, items: int = ITEMS) -> list[str]:
    return planned_episodes(engine, folder, count, items, prefix=folder.name)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "sigterm"])
def test_one_resume_after_a_kill_storm_at_an_exhausted_budget_records_every_billed_job(
    engine: Engine,
    database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    sig: signal.Signals,
) -> None:
    """Eight generates of three images at 0.10 against a weekly budget that cannot hold
    them all; two of them are signalled with jobs accepted at the provider. Then one
    `runs resume` of each run, at once (a killed holder's leases still live): every job the
    provider made is recorded, so the ledger equals the bill; no accepted job is left
    uncollected (`check`); the budget is never passed; a resume stopped at the budget says
    what it collected, and never claims to have collected what it did not."""
    _profile(tmp_path, monkeypatch)
    for trial in (1, 2):  # the week's budget raised by 1.00 a trial: no storm (2.40) fits
        budget = trial * 1_000_000
        set_budget = _cli("pipelines", "set-budget", "weekly", f"{trial}.00", "--per", "week")
        assert set_budget.returncode == 0, set_budget.stderr
        episodes = _episodes(engine, tmp_path / f"t{trial}")
        runs = [
            run["run_id"]
            for e, *_ in signal_storm(episodes, sig)  # the signalled ones first, their leases live
            for run in json.loads(_cli("runs", "list", "--episode", e, "--json").stdout)
        ]
        stopped = []
        for run_id in runs:
            resumed = _cli("runs", "resume", run_id, "--json")
            assert resumed.returncode in (0, 7), (resumed.returncode, resumed.stderr)
            if resumed.returncode == 7:
                stopped.append(json.loads(resumed.stdout)["message"])
        billed = _bill()
        assert ledger_micros(engine) == billed, (trial, ledger_micros(engine), billed)
        assert billed <= budget, (trial, billed)
        checked = _cli("check", "--all")
        assert "never collected" not in checked.stdout, checked.stdout
        for message in stopped:
            assert "budget reached" in message, message
            assert "calls in flight were collected" not in message, message
            assert "not collected" not in message, message


def test_retry_at_an_exhausted_budget_collects_the_killed_generates_jobs_and_says_so(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A generate of six images at 0.10 is killed (-9) with three calls accepted at the
    provider, and the weekly budget set to 0.30: all of it is in flight. `retry` at once
    (the dead process's leases still live) buys nothing, but follows and collects those
    three jobs, and its line counts exactly that; the ledger is the provider's bill. With
    the budget raised, `runs resume` buys the other three, each item paid once."""
    _profile(tmp_path, monkeypatch)
    assert _cli("pipelines", "set-budget", "weekly", "0.60", "--per", "week").returncode == 0
    (episode,) = _episodes(engine, tmp_path / "one", count=1, items=6)
    assert EPISODIC is not None
    process = subprocess.Popen(
        [EPISODIC, "generate", episode, "--concurrency", "3"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )
    deadline = time.monotonic() + 60
    # three accepted and not collected (a price never billed sends its first call alone:
    # the killed process may have collected that one already)
    while outstanding_of_process(process.pid) < 3:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "generate made no progress"
        time.sleep(0.02)
    process.kill()
    process.communicate(timeout=60)
    made_by_it, left = jobs_of_process(process.pid), outstanding_of_process(process.pid)
    # the budget lowered to what is spent and in flight: nothing more may be bought
    lowered = f"0.{made_by_it}0"
    assert _cli("pipelines", "set-budget", "weekly", lowered, "--per", "week").returncode == 0

    retried = _cli("retry", episode, "--json")

    assert retried.returncode == 7, (retried.stdout, retried.stderr)
    answer = json.loads(retried.stdout)
    unbought = 6 - made_by_it
    assert (answer["collected"], answer["collected_earlier"]) == (left, left), answer
    assert (answer["not_collected"], answer["not_bought"]) == (0, unbought), answer
    message = answer["message"]
    assert f"collected {left} images here ({left} of them accepted before this process)" in (
        message
    )
    images = "image" if unbought == 1 else "images"
    assert f"no paid call left uncollected; {unbought} {images} not bought" in message, message
    assert ledger_micros(engine) == _bill() == made_by_it * 100_000
    assert "never collected" not in _cli("check", "--all").stdout
    assert _cli("pipelines", "set-budget", "weekly", "0.60", "--per", "week").returncode == 0
    done = _cli("runs", "resume", answer["run_id"], "--json")
    assert done.returncode == 0, done.stderr
    made = made_jobs_per_key()
    assert len(made) == 6 and set(made.values()) == {1}, made
    assert ledger_micros(engine) == _bill() == 600_000


def test_a_claim_batch_past_its_limit_still_takes_the_items_it_can_collect(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One claim transaction over [a new item, an item whose job was accepted by a process
    now gone] at a cap already reached: the new paid call is refused at the limit, and the
    accepted job is still claimed to be collected (it costs nothing new). A settle-only
    claim never makes a new paid call, whatever the money allows."""
    _profile(tmp_path, monkeypatch)
    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "pl", ["a", "b", "c"], profile="paid"))
    run_id = new_run(episode)
    RunStore(engine).transition_run(run_id, RunState.RUNNING, lease_s=30)
    with engine.connect() as conn:
        a, b, c = [int(r[0]) for r in conn.execute(text("SELECT id FROM items ORDER BY id"))]
    reserve = Reservation(100_000, "USD")
    cap = Guard(run_id, "weekly", RunLimits(None, 100_000), reserve)
    claims = ClaimStore(engine)
    kw = {"lease_s": 30.0, "max_attempts": 3, "profile": "paid", "reserve": reserve}
    first = claims.claim(c, run_id, "gone", guard=cap, **kw)  # type: ignore[arg-type]
    assert isinstance(first, Claim) and first.submission is not None
    assert LedgerStore(engine).accept(first.submission.pk, "job-c")
    LeaseStore(engine).release_all("gone", "interrupted")  # its process is gone

    new, collect = claims.claim_many([(a, True), (c, True)], run_id, "me", guard=cap, **kw)  # type: ignore[arg-type]

    assert isinstance(new, Refusal) and new.reason == RefusalReason.BUDGET, new
    assert isinstance(collect, Claim) and collect.action == ClaimAction.COLLECT, collect
    roomy = Guard(run_id, "weekly", RunLimits(), reserve)
    settle = claims.claim(b, run_id, "me", guard=roomy, settle_only=True, **kw)  # type: ignore[arg-type]
    assert isinstance(settle, Refusal) and settle.reason == RefusalReason.SETTLE_ONLY, settle
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM submissions")).scalar_one() == 1
