"""The provider's limit of items in flight holds across runs, processes and machines, and a
killed holder's capacity comes back by itself.

Counted where the money is spent: the fake provider's own log, a job being in flight from
its creation to its collection.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from episodic.core.ids import WeekId
from episodic.pipeline.allocation import allocate
from tests.generation import (
    Episode,
    jobs_per_key,
    made_jobs_per_key,
    provider_log,
    write_playlist,
)
from tests.integration import race_workers as w
from tests.integration.paid_episodes import planned_episodes

pytestmark = pytest.mark.slow

LIMIT = 3


def _profiles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, delay_ms: int, max_job_s: int = 60
) -> None:
    path = tmp_path / "providers.yaml"
    path.write_text(
        "profiles:\n  limited:\n    kind: fake\n    cost_per_image_minor: 4\n"
        f"    max_concurrency: {LIMIT}\n    delay_ms: {delay_ms}\n    max_job_s: {max_job_s}\n"
    )
    monkeypatch.setenv("EPISODIC_PROVIDERS_FILE", str(path))
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))


def max_in_flight(events: list[dict[str, Any]]) -> int:
    """Most jobs the provider ran at once: each from its `job_created` until the provider
    finished it (`ready_at`) or it was collected, whichever came first. A job nobody
    collects (its sender was interrupted or killed) still runs at the provider."""
    ends: dict[str, float] = {}
    moments = []
    for event in events:
        if event["event"] == "job_created":
            moments.append((event["at"], 1))
            ends[event["remote_ref"]] = event["ready_at"]
        elif event["event"] == "collect" and event["remote_ref"] in ends:
            ends[event["remote_ref"]] = min(ends[event["remote_ref"]], event["at"])
    moments += [(end, -1) for end in ends.values()]
    peak = current = 0
    for _, step in sorted(moments, key=lambda m: (m[0], m[1])):  # a collect first on a tie
        current += step
        peak = max(peak, current)
    return peak


def test_two_concurrent_runs_never_push_the_provider_above_its_limit(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two episodes of one provider profile generated at once by separate processes, each
    asking for 8 items at a time: never more than the profile's 3 jobs at the provider."""
    _profiles(tmp_path, monkeypatch, delay_ms=120)
    for trial in range(3):
        monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / f"provider{trial}.jsonl"))
        episodes = planned_episodes(engine, tmp_path / f"t{trial}", 2, items=9, profile="limited")
        results = w.run_processes(
            [(w.generate_worker, (database_url, [e], "generate")) for e in episodes]
            + [(w.generate_worker, (database_url, [episodes[0]], "generate"))]  # a second
        )  # run of the first episode too (a double click): it joins or follows
        for out in results:
            for _target, state, code, *_ in out:
                assert state == "completed" and code == 0, out
        assert len(jobs_per_key()) == 18 and set(jobs_per_key().values()) == {1}
        peak = max_in_flight(provider_log())
        assert 2 <= peak <= LIMIT, peak  # used in parallel, and never above the limit


def test_a_killed_holder_gives_its_capacity_back_by_itself(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kill -9 of a process holding every slot: another run gets them by itself, with no
    sweep, once the holder's leases (EPISODIC_LEASE_S=5) have run out and its jobs are
    older than the profile's max_job_s (8 s), and pays each item once."""
    # The holder's jobs never finish; the profile says a job takes at most 8 s, so the jobs
    # the holder left behind stop counting as slots then (a profile that tells the truth
    # about its provider's jobs gets its capacity back when they end).
    _profiles(tmp_path, monkeypatch, delay_ms=60_000, max_job_s=8)
    slow, fast = planned_episodes(engine, tmp_path, 2, items=LIMIT, profile="limited")
    holder = w.cli_generate(
        str(tmp_path / "home"), database_url, slow, env={"EPISODIC_LEASE_S": "5"}
    )
    deadline = time.monotonic() + 120
    while sum(1 for e in provider_log() if e["event"] == "job_created") < LIMIT:
        assert holder.poll() is None and time.monotonic() < deadline, holder.communicate()
        time.sleep(0.1)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    path = tmp_path / "providers.yaml"  # the next run's jobs are quick
    path.write_text(path.read_text().replace("delay_ms: 60000", "delay_ms: 50"))
    outcome = Episode(engine, fast).generate(lease_s=5, concurrency=8)
    assert outcome.state.value == "completed", outcome.message
    made = made_jobs_per_key()  # the jobs the provider holds: a kill can precede a log line
    assert len(made) == 2 * LIMIT and set(made.values()) == {1}, made


def test_an_interrupted_holders_jobs_keep_their_slots_while_they_run(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM of a process whose 3 jobs (the whole limit) run at the provider for 3 s: it
    gives its claims up at once, but its jobs still run there. A run of another episode
    started right after must wait for them (max_job_s: 6), not take the freed claims' slots:
    the provider never runs more than its limit. A later run collects the interrupted jobs
    at no cost (one job per item)."""
    _profiles(tmp_path, monkeypatch, delay_ms=3000, max_job_s=6)
    held, waiting = planned_episodes(engine, tmp_path, 2, items=LIMIT, profile="limited")
    holder = w.cli_generate(str(tmp_path / "home"), database_url, held, env={})
    deadline = time.monotonic() + 120
    while sum(1 for e in provider_log() if e["event"] == "accepted") < LIMIT:
        assert holder.poll() is None and time.monotonic() < deadline, holder.communicate()
        time.sleep(0.05)
    holder.send_signal(signal.SIGTERM)
    out, err = holder.communicate(timeout=60)
    assert holder.returncode == 130, (out, err)  # interrupted: the run is paused
    outcome = Episode(engine, waiting).generate(concurrency=8)
    assert outcome.state.value == "completed", outcome.message
    assert max_in_flight(provider_log()) <= LIMIT, provider_log()
    resumed = Episode(engine, held).generate(concurrency=8)
    assert resumed.state.value == "completed", resumed.message
    assert len(jobs_per_key()) == 2 * LIMIT and set(jobs_per_key().values()) == {1}


def test_a_run_collects_its_own_job_left_for_later_instead_of_waiting_for_its_slot(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Limit 1: the second item's job takes 2 s, longer than the run's collect timeout (1 s),
    so it is left for later, and its open submission keeps the only slot (the job still runs
    at the provider). Throttled with nothing of its own running, the run does not wait for
    max_job_s (30 s here) to end failed with that job uncollected: it collects its own job
    again: the run completes, one job per item, never more
    than one in flight."""
    path = tmp_path / "providers.yaml"
    path.write_text(
        "profiles:\n  limited:\n    kind: fake\n    cost_per_image_minor: 4\n"
        "    max_concurrency: 1\n    delay_ms: 50\n    max_job_s: 30\n"
    )
    monkeypatch.setenv("EPISODIC_PROVIDERS_FILE", str(path))
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))
    allocated = allocate(engine, "weekly", WeekId.parse("2026-W32"), "self-block")
    episode = Episode(engine, str(allocated.episode.episode_id))
    titles = ["one", "two [[DELAY_MS:2000]]", "three", "four"]
    episode.plan(write_playlist(tmp_path / "pl", titles, profile="limited"))
    outcome = episode.generate(concurrency=4, collect_timeout_s=1)
    assert outcome.state.value == "completed", outcome.message  # "two" collected, not left
    assert len(jobs_per_key()) == 4 and set(jobs_per_key().values()) == {1}
    assert max_in_flight(provider_log()) <= 1


def test_a_run_waiting_for_a_provider_slot_says_so(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every slot of the profile is held by another run: the run says it waits for a slot
    (the CLI shows it on its progress line, the flow logs it), then goes on when the slot
    frees, rather than standing still without a word."""
    import threading

    from episodic.core.planning import RunOptions
    from episodic.core.runs import Claim
    from episodic.core.settings import load_settings
    from episodic.core.states import RunState
    from episodic.pipeline.gate import EnvironmentCredentials
    from episodic.pipeline.generation import generate
    from episodic.storage.claims import ClaimStore
    from episodic.storage.leases import LeaseStore
    from episodic.storage.runs import RunStore
    from tests.generation import new_run

    _profiles(tmp_path, monkeypatch, delay_ms=0)
    (path := tmp_path / "providers.yaml").write_text(
        path.read_text().replace(f"max_concurrency: {LIMIT}", "max_concurrency: 1")
    )
    holder_episode, waiting_episode = planned_episodes(
        engine, tmp_path, 2, items=1, profile="limited"
    )
    run_id = new_run(Episode(engine, holder_episode))
    RunStore(engine).transition_run(run_id, RunState.RUNNING, lease_s=30)
    (item,) = RunStore(engine).run_items(run_id)
    store = ClaimStore(engine)
    held = store.claim(
        item.pk,
        run_id,
        "elsewhere",
        lease_s=30,
        max_attempts=3,
        profile="limited",
        provider_limit=1,
        max_job_s=60,
    )
    assert isinstance(held, Claim)
    said: list[str | None] = []

    def on_start(runner: object, _run_id: str) -> None:
        runner.on_wait = said.append  # type: ignore[attr-defined]

    threading.Timer(1.0, LeaseStore(engine).release_unstarted, (held, "given up")).start()
    outcome = generate(
        engine,
        load_settings(),
        "weekly",
        waiting_episode,
        RunOptions(),
        EnvironmentCredentials(),
        on_start=on_start,
    )
    assert outcome.state.value == "completed", outcome.message
    assert said[0] is not None and said[0].startswith("waiting for a provider slot"), said
    assert said[-1] is None  # and it said when it went on


def test_open_submissions_hold_slots_until_collected_or_older_than_max_job_s(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The slot count, at the claim: an accepted job whose claim was given up still takes a
    slot of its profile; it stops when the job is collected (the item's own run may claim
    it back to collect it), or when it was sent more than max_job_s ago."""
    from datetime import timedelta

    from sqlalchemy import update

    from episodic.core.runs import Claim, Refusal
    from episodic.core.states import RunState
    from episodic.storage.base import utcnow
    from episodic.storage.claims import ClaimStore
    from episodic.storage.leases import LeaseStore
    from episodic.storage.ledger import LedgerStore
    from episodic.storage.models import SubmissionRow
    from episodic.storage.runs import RunStore
    from tests.generation import new_run

    _profiles(tmp_path, monkeypatch, delay_ms=0)
    first, second = planned_episodes(engine, tmp_path, 2, items=1, profile="limited")
    store, runs = ClaimStore(engine), RunStore(engine)
    ledger, leases = LedgerStore(engine), LeaseStore(engine)
    limits = {"provider_limit": 1, "max_job_s": 60, "lease_s": 30, "max_attempts": 3}
    items = {}
    for episode_id in (first, second):
        run_id = new_run(Episode(engine, episode_id))
        runs.transition_run(run_id, RunState.RUNNING, lease_s=30)
        items[episode_id] = (run_id, runs.run_items(run_id)[0])
    run_a, item_a = items[first]
    run_b, item_b = items[second]
    claim = store.claim(item_a.pk, run_a, "a", profile="limited", **limits)
    assert isinstance(claim, Claim) and claim.submission is not None
    assert ledger.accept(claim.submission.pk, "job-a")
    assert leases.release_all("a", "interrupted") == 1  # the job still runs at the provider
    refused = store.claim(item_b.pk, run_b, "b", profile="limited", **limits)
    assert isinstance(refused, Refusal) and refused.reason == "throttled"
    assert isinstance(  # another profile's limit is not taken by it
        store.claim(item_b.pk, run_b, "b", profile="other", **limits), Claim
    )
    leases.release_all("b", "test")
    again = store.claim(item_a.pk, run_a, "a2", profile="limited", **limits)
    assert isinstance(again, Claim) and again.action == "collect"  # its own slot
    leases.release_all("a2", "interrupted again")
    with engine.begin() as conn:  # sent longer ago than the profile's max_job_s
        conn.execute(update(SubmissionRow).values(created_at=utcnow() - timedelta(seconds=61)))
    assert isinstance(store.claim(item_b.pk, run_b, "b", profile="limited", **limits), Claim)


def test_a_claim_is_worked_once_even_if_its_task_runs_twice(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dask reschedules a task whose worker died: the second execution of the same item task
    finds the claim's token consumed and sends nothing (the first may already have paid)."""
    from episodic.storage.claims import ClaimStore
    from episodic.storage.leases import LeaseStore
    from tests.generation import new_run

    _profiles(tmp_path, monkeypatch, delay_ms=0)
    (episode_id,) = planned_episodes(engine, tmp_path, 1, items=1, profile="limited")
    run_id = new_run(Episode(engine, episode_id))
    store = ClaimStore(engine)
    leases = LeaseStore(engine)
    from episodic.storage.runs import RunStore

    runs = RunStore(engine)
    runs.transition_run(
        run_id, __import__("episodic.core.states").core.states.RunState.RUNNING, lease_s=30
    )
    (item,) = runs.run_items(run_id)
    claim = store.claim(
        item.pk, run_id, "flow", lease_s=30, max_attempts=3, profile="limited", provider_limit=3
    )
    assert not isinstance(claim, type(None)) and claim.token  # type: ignore[union-attr]
    args = (item.pk, run_id, "flow", claim.action, claim.submission.pk, claim.token)  # type: ignore[union-attr]
    first = leases.load_claim(*args)
    assert first is not None and first.action == "submit"
    assert leases.load_claim(*args) is None  # the re-executed task: nothing to send
    # Freeing a claim whose task already loaded it keeps the intent: it may have been sent.
    assert leases.release_unstarted(claim, "lost worker") is False  # type: ignore[arg-type]


def test_a_claim_freed_before_its_task_started_is_withdrawn_and_never_worked(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The flow frees a claim whose task ended before loading it: the intent goes (nothing
    was sent), and a late execution of that task finds the token gone and sends nothing."""
    from episodic.core.states import RunState
    from episodic.storage.claims import ClaimStore
    from episodic.storage.leases import LeaseStore
    from episodic.storage.runs import RunStore
    from tests.generation import new_run

    _profiles(tmp_path, monkeypatch, delay_ms=0)
    (episode_id,) = planned_episodes(engine, tmp_path, 1, items=1, profile="limited")
    run_id = new_run(Episode(engine, episode_id))
    store, runs = ClaimStore(engine), RunStore(engine)
    leases = LeaseStore(engine)
    runs.transition_run(run_id, RunState.RUNNING, lease_s=30)
    (item,) = runs.run_items(run_id)
    claim = store.claim(
        item.pk, run_id, "flow", lease_s=30, max_attempts=3, profile="limited", provider_limit=3
    )
    assert claim is not None and claim.submission is not None and claim.token
    assert leases.release_unstarted(claim, "task never started") is True
    late = (item.pk, run_id, "flow", claim.action, claim.submission.pk, claim.token)
    assert leases.load_claim(*late) is None
    (after,) = runs.run_items(run_id)
    assert after.state == "failed" and after.attempts == 0  # the attempt was given back
    from sqlalchemy import func, select

    from episodic.storage.models import SubmissionRow

    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(SubmissionRow)).scalar_one() == 0


def test_settling_an_open_submission_needs_no_slot_and_the_run_finds_what_it_may_collect(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Limit 1 and two accepted jobs of one run nobody collects (a killed process's, or two
    left for later): each job holds a slot, so the count is full. Collecting either was
    refused as throttled (the other one held "the" slot) and the run could only wait for
    `max_job_s`. A claim that settles an open submission takes no new slot: it is granted;
    a new paid call is still refused. `collectible` names exactly the run's items whose
    accepted job (or unanswered intent) no live claim holds."""
    from episodic.core.runs import Claim, Refusal
    from episodic.core.states import RunState
    from episodic.storage.claims import ClaimStore
    from episodic.storage.leases import LeaseStore
    from episodic.storage.ledger import LedgerStore
    from episodic.storage.runs import RunStore
    from tests.generation import new_run

    _profiles(tmp_path, monkeypatch, delay_ms=0)
    allocated = allocate(engine, "weekly", WeekId.parse("2026-W32"), "settle")
    episode = Episode(engine, str(allocated.episode.episode_id))
    episode.plan(write_playlist(tmp_path / "pl", ["a", "b", "c", "d"], profile="limited"))
    store, runs = ClaimStore(engine), RunStore(engine)
    ledger, leases = LedgerStore(engine), LeaseStore(engine)
    run_id = new_run(episode)
    runs.transition_run(run_id, RunState.RUNNING, lease_s=30)
    a, b, c, d = runs.run_items(run_id)
    open_slots = {"max_job_s": 600, "lease_s": 30, "max_attempts": 3, "profile": "limited"}
    for item, owner in ((a, "dead-1"), (b, "dead-2")):  # no limit while they were sent
        claim = store.claim(item.pk, run_id, owner, provider_limit=None, **open_slots)
        assert isinstance(claim, Claim) and claim.submission is not None
        assert ledger.accept(claim.submission.pk, f"job-{item.item_id}")
        leases.release_all(owner, "killed")  # the jobs still run at the provider
    held = store.claim(c.pk, run_id, "live", provider_limit=None, **open_slots)
    assert isinstance(held, Claim)  # an intent under a live claim: not collectible
    assert [it.pk for it in runs.collectible(run_id, "limited")] == [a.pk, b.pk]
    assert runs.collectible(run_id, "other") == []  # another profile's slots are not these
    limits = {**open_slots, "provider_limit": 1}
    refused = store.claim(d.pk, run_id, "recovery", **limits)
    assert isinstance(refused, Refusal) and refused.reason == "throttled"  # a new paid call
    for item in (a, b):
        taken = store.claim(item.pk, run_id, "recovery", **limits)
        assert isinstance(taken, Claim) and taken.action == "collect", taken
    assert runs.collectible(run_id, "limited") == []  # held now, by the recovery
