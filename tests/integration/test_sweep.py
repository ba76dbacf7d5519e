"""The stale sweep: each bucket, what it must leave alone, and two sweeps at once.

Dead processes are simulated where the point is the bucket (a lease in the past, a run row
left pending); `tests/acceptance/test_crash_recovery.py` kills real `episodic` processes.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, select, update

from episodic.core.planning import RunOptions
from episodic.core.runs import Claim
from episodic.core.settings import load_settings
from episodic.core.states import RunState
from episodic.pipeline.admission import dedup_policy
from episodic.pipeline.check import check_episodes
from episodic.pipeline.sweep import sweep
from episodic.storage.base import utcnow
from episodic.storage.claims import ClaimStore
from episodic.storage.ledger import LedgerStore
from episodic.storage.models import ItemRow, RunRow, SubmissionRow
from episodic.storage.runs import RunStore
from tests.generation import Episode, jobs_per_key, new_episode, new_run, write_playlist
from tests.integration import race_workers as w


@pytest.fixture(autouse=True)
def fake_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "provider.jsonl"
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(path))
    return path


@pytest.fixture
def episode(engine: Engine, tmp_path: Path) -> Episode:
    ep = new_episode(engine)
    ep.plan(write_playlist(tmp_path / "pl", ["a", "b", "c"]))
    return ep


def _state(engine: Engine, run_id: str) -> str:
    return RunStore(engine).run_state(run_id)


def _item_states(engine: Engine) -> dict[str, str]:
    with engine.connect() as conn:
        rows = conn.execute(select(ItemRow.video_id, ItemRow.state)).all()
    return {row[0]: row[1] for row in rows}


def _dead_run_holding_items(episode: Episode, *, accept_first: bool) -> tuple[str, list[Claim]]:
    """A run whose process claimed every item and then died: leases in the past. The first
    item's paid call was accepted by the provider (a remote reference is recorded)."""
    store, claims = RunStore(episode.engine), ClaimStore(episode.engine)
    run_id = new_run(episode)
    store.transition_run(run_id, RunState.RUNNING, lease_s=30)
    held = []
    for item in store.run_items(run_id):
        got = claims.claim(item.pk, run_id, "dead:1", lease_s=30, max_attempts=3, profile="fake")
        assert isinstance(got, Claim)
        held.append(got)
    if accept_first:  # the provider really made this job before the process died
        from episodic.providers.base import ImageRequest
        from episodic.providers.fake import FakeProvider

        sub, item = held[0].submission, held[0].item
        assert sub is not None
        provider = FakeProvider(
            profile_id="fake", state_dir=load_settings().home_path / "fake-provider"
        )
        ref = provider.submit(
            ImageRequest(sub.client_reference, "e", item.item_id, item.prompt, item.seed)
        )
        LedgerStore(episode.engine).accept(sub.pk, ref)
    past = utcnow() - timedelta(seconds=5)
    with episode.engine.begin() as conn:
        conn.execute(update(ItemRow).values(lease_expires_at=past))
        conn.execute(update(RunRow).where(RunRow.id == run_id).values(lease_expires_at=past))
    return run_id, held


def test_expired_leases_are_failed_and_a_resume_finishes_without_paying_twice(
    episode: Episode,
) -> None:
    run_id, held = _dead_run_holding_items(episode, accept_first=True)
    findings = check_episodes(episode.engine, "weekly", policy=dedup_policy(load_settings()))
    assert any(f.check == "liveness" and run_id in f.detail for f in findings), findings
    report = sweep(episode.engine, load_settings())
    assert report.moved["expired_runs"] == [run_id]
    assert sorted(report.moved["expired_items"]) == sorted(c.item.pk for c in held)
    assert _state(episode.engine, run_id) == "failed"
    assert "lease expired" in (RunStore(episode.engine).get_run(run_id).error_text or "")
    assert set(_item_states(episode.engine).values()) == {"failed"}
    with episode.engine.connect() as conn:  # the accepted job keeps its reference
        refs = conn.execute(
            select(SubmissionRow.state, SubmissionRow.remote_ref).where(
                SubmissionRow.remote_ref.is_not(None)
            )
        ).all()
    assert [r[0] for r in refs] == ["accepted"]
    assert sweep(episode.engine, load_settings()).total == 0  # nothing left to reap
    outcome = episode.resume(run_id)
    assert outcome.state == RunState.COMPLETED
    # The accepted job is collected, the two intents reconciled: one provider job per item.
    assert set(jobs_per_key().values()) == {1} and len(jobs_per_key()) == 3


def test_a_never_started_pending_run_is_cancelled_with_its_items(
    episode: Episode, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = new_run(episode)  # created, never started (its caller died)
    assert sweep(episode.engine, load_settings()).count("stale_pending_runs") == 0  # young
    with episode.engine.begin() as conn:
        conn.execute(update(RunRow).values(created_at=utcnow() - timedelta(seconds=3600)))
    findings = check_episodes(episode.engine, "weekly", policy=dedup_policy(load_settings()))
    assert any("never started" in f.detail for f in findings)
    dry = sweep(episode.engine, load_settings(), dry_run=True)
    assert (
        dry.moved["stale_pending_runs"] == [run_id] and _state(episode.engine, run_id) == "pending"
    )
    report = sweep(episode.engine, load_settings())
    assert report.moved["stale_pending_runs"] == [run_id]
    assert _state(episode.engine, run_id) == "cancelled"
    assert set(_item_states(episode.engine).values()) == {"cancelled"}
    assert check_episodes(episode.engine, "weekly") == []
    assert episode.generate().state == RunState.COMPLETED  # a new request starts over


def test_orphaned_children_of_a_cancelled_parent_are_cancelled_unless_shared(
    episode: Episode, tmp_path: Path
) -> None:
    """A parent cancelled by an older version (children left pending): the sweep cancels
    them, except an item that an active run still includes."""
    from episodic.storage.models import RunItemRow

    orphaned_parent = new_run(episode)
    with episode.engine.begin() as conn:  # cancelled without touching its children
        conn.execute(update(RunRow).where(RunRow.id == orphaned_parent).values(state="cancelled"))
    active = new_run(episode, RunOptions(only=frozenset({1})))  # shares the first video's item
    with episode.engine.connect() as conn:
        first = conn.execute(
            select(RunItemRow.item_pk).where(RunItemRow.run_id == active)
        ).scalar_one()
    report = sweep(episode.engine, load_settings())
    assert len(report.moved["orphaned_items"]) == 2 and first not in report.moved["orphaned_items"]
    states = _item_states(episode.engine)
    assert sorted(states.values()) == ["cancelled", "cancelled", "pending"]


def test_runs_cancel_terminalizes_children_but_not_shared_or_running_ones(
    episode: Episode,
) -> None:
    store = RunStore(episode.engine)
    run_id = new_run(episode)
    other = new_run(episode)  # a second active run includes the same items
    store.transition_run(run_id, RunState.CANCELLED, "cancelled by operator")
    assert set(_item_states(episode.engine).values()) == {"pending"}  # shared: kept
    store.transition_run(other, RunState.CANCELLED, "cancelled by operator")
    assert set(_item_states(episode.engine).values()) == {"cancelled"}


def test_a_slow_heartbeating_item_is_left_alone(
    episode: Episode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An image that takes several lease lengths is alive: sweeps during it reap nothing."""
    import threading

    monkeypatch.setenv("EPISODIC_FAKE_DELAY_MS", "2500")
    result: list[object] = []
    worker = threading.Thread(target=lambda: result.append(episode.generate(lease_s=2.0)))
    worker.start()
    moved = 0
    while worker.is_alive():
        moved += sweep(episode.engine, load_settings()).total
        worker.join(timeout=0.3)
    assert moved == 0
    outcome = result[0]
    assert outcome.state == RunState.COMPLETED  # type: ignore[attr-defined]
    assert set(jobs_per_key().values()) == {1} and len(jobs_per_key()) == 3


def test_completed_work_is_never_touched(episode: Episode) -> None:
    episode.generate()
    with episode.engine.begin() as conn:  # even with every timestamp far in the past
        old = utcnow() - timedelta(days=30)
        conn.execute(update(RunRow).values(created_at=old, heartbeat_at=old))
    assert sweep(episode.engine, load_settings()).total == 0
    assert set(_item_states(episode.engine).values()) == {"completed"}


@pytest.mark.slow
def test_two_sweeps_at_once_never_double_act(
    engine: Engine, database_url: str, tmp_path: Path
) -> None:
    """Four sweeping processes released together over 40 dead runs: every row is moved
    exactly once, by exactly one of them."""
    dead: list[str] = []
    items = 0
    for n in range(10):
        ep = new_episode(engine, key=f"test:{n}")
        ep.plan(write_playlist(tmp_path / f"pl{n}", ["a", "b"]))
        for _ in range(4):
            run_id = new_run(ep)
            dead.append(run_id)
        run_id, held = _dead_run_holding_items(ep, accept_first=False)
        dead.append(run_id)
        items += len(held)
    past = utcnow() - timedelta(seconds=60)
    with engine.begin() as conn:
        conn.execute(update(RunRow).values(state="running", lease_expires_at=past, started_at=past))
    answers = w.run_processes(
        [(w.sweep_worker, (database_url, str(tmp_path / "home"))) for _ in range(4)]
    )
    assert not [a for a in answers if "error" in a], answers
    runs_moved = [r for a in answers for r in a["expired_runs"]]
    items_moved = [i for a in answers for i in a["expired_items"]]
    assert sorted(runs_moved) == sorted(dead)  # each exactly once across the four
    assert len(items_moved) == len(set(items_moved)) == items
