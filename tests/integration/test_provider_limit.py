"""The provider's limit of items in flight holds across runs, processes and machines, and a
killed holder's capacity comes back by itself (issue 11).

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

from core.ids import WeekId
from pipeline.allocation import allocate
from tests.generation import Episode, jobs_per_key, provider_log, write_playlist
from tests.integration import race_workers as w

pytestmark = pytest.mark.slow

LIMIT = 3


def _profiles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, delay_ms: int) -> None:
    path = tmp_path / "providers.yaml"
    path.write_text(
        "profiles:\n  limited:\n    kind: fake\n    cost_per_image_minor: 4\n"
        f"    max_concurrency: {LIMIT}\n    delay_ms: {delay_ms}\n"
    )
    monkeypatch.setenv("EPISODIC_PROVIDERS_FILE", str(path))
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))


def _episodes(engine: Engine, tmp_path: Path, count: int, items: int) -> list[str]:
    ids = []
    for n in range(count):
        episode_id = str(
            allocate(
                engine, "weekly", WeekId.parse("2026-W32"), f"{tmp_path.name}-{n}"
            ).episode.episode_id
        )
        playlist = write_playlist(
            tmp_path / f"pl{n}", [f"e{n}i{i}" for i in range(items)], profile="limited"
        )
        Episode(engine, episode_id).plan(playlist)
        ids.append(episode_id)
    return ids


def max_in_flight(events: list[dict[str, Any]]) -> int:
    """Most jobs the provider held at once: each from `job_created` to its `collect`."""
    moments = []
    for event in events:
        if event["event"] == "job_created":
            moments.append((event["at"], 1))
        elif event["event"] == "collect":
            moments.append((event["at"], -1))
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
        episodes = _episodes(engine, tmp_path / f"t{trial}", 2, items=9)
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
    """kill -9 of a process holding every slot: another run gets them when the holder's
    leases (EPISODIC_LEASE_S=5) run out, with no sweep, and pays each item once."""
    _profiles(tmp_path, monkeypatch, delay_ms=60_000)  # the holder's jobs never finish
    slow, fast = _episodes(engine, tmp_path, 2, items=LIMIT)
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
    created = [e for e in provider_log() if e["event"] == "job_created"]
    assert len(created) == 2 * LIMIT and len({e["client_reference"] for e in created}) == 2 * LIMIT


def test_a_claim_is_worked_once_even_if_its_task_runs_twice(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dask reschedules a task whose worker died: the second execution of the same item task
    finds the claim's token consumed and sends nothing (the first may already have paid)."""
    from storage.claims import ClaimStore
    from tests.generation import new_run

    _profiles(tmp_path, monkeypatch, delay_ms=0)
    (episode_id,) = _episodes(engine, tmp_path, 1, items=1)
    run_id = new_run(Episode(engine, episode_id))
    store = ClaimStore(engine)
    from storage.runs import RunStore

    runs = RunStore(engine)
    runs.transition_run(run_id, __import__("core.states").states.RunState.RUNNING, lease_s=30)
    (item,) = runs.run_items(run_id)
    claim = store.claim(
        item.pk, run_id, "flow", lease_s=30, max_attempts=3, profile="limited", provider_limit=3
    )
    assert not isinstance(claim, type(None)) and claim.token  # type: ignore[union-attr]
    args = (item.pk, run_id, "flow", claim.action, claim.submission.pk, claim.token)  # type: ignore[union-attr]
    first = store.load_claim(*args)
    assert first is not None and first.action == "submit"
    assert store.load_claim(*args) is None  # the re-executed task: nothing to send
    # Freeing a claim whose task already loaded it keeps the intent: it may have been sent.
    assert store.release_unstarted(claim, "lost worker") is False  # type: ignore[arg-type]


def test_a_claim_freed_before_its_task_started_is_withdrawn_and_never_worked(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The flow frees a claim whose task ended before loading it: the intent goes (nothing
    was sent), and a late execution of that task finds the token gone and sends nothing."""
    from core.states import RunState
    from storage.claims import ClaimStore
    from storage.runs import RunStore
    from tests.generation import new_run

    _profiles(tmp_path, monkeypatch, delay_ms=0)
    (episode_id,) = _episodes(engine, tmp_path, 1, items=1)
    run_id = new_run(Episode(engine, episode_id))
    store, runs = ClaimStore(engine), RunStore(engine)
    runs.transition_run(run_id, RunState.RUNNING, lease_s=30)
    (item,) = runs.run_items(run_id)
    claim = store.claim(
        item.pk, run_id, "flow", lease_s=30, max_attempts=3, profile="limited", provider_limit=3
    )
    assert claim is not None and claim.submission is not None and claim.token
    assert store.release_unstarted(claim, "task never started") is True
    late = (item.pk, run_id, "flow", claim.action, claim.submission.pk, claim.token)
    assert store.load_claim(*late) is None
    (after,) = runs.run_items(run_id)
    assert after.state == "failed" and after.attempts == 0  # the attempt was given back
    from sqlalchemy import func, select

    from storage.models import SubmissionRow

    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(SubmissionRow)).scalar_one() == 0
