"""`weekly_episode` under the Prefect test harness.

Flow runs are created the way production creates them: scheduled runs by the server's own
scheduling endpoint (``auto_scheduled``, the slot as expected start), manual runs from the
deployment (the UI's "Run") or by calling the flow. The harness runs no scheduler service,
so the tests ask for the schedule explicitly.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from uuid import UUID, uuid4

import pytest
from prefect.client.orchestration import get_client
from prefect.schedules import Cron
from sqlalchemy import create_engine

import episodic.tasks.allocate
from episodic.core.errors import NoInvocationIdentity
from episodic.core.ids import WeekId
from episodic.flows import local
from episodic.flows.weekly import weekly_episode
from episodic.storage.episodes import EpisodeRepository

pytestmark = pytest.mark.slow

WEEK_START = datetime(2026, 8, 3, tzinfo=UTC)  # Monday of 2026-W32


def deploy(name: str, cron: str = "0 9 * * 1,4", timezone: str = "UTC") -> UUID:
    """A deployment of its own for each test (the harness server lives for the session)."""
    name = f"{name}-{uuid4().hex[:8]}"
    schedule = Cron(cron, timezone=timezone, slug=f"{name}-slots")
    return local.apply_deployment(weekly_episode, name, schedule)


def deployment_name(deployment_id: UUID) -> str:
    with get_client(sync_client=True) as client:
        return client.read_deployment(deployment_id).name


def slots(deployment_id: UUID, start: datetime = WEEK_START, days: int = 7):  # type: ignore[no-untyped-def]
    return local.schedule_slots(deployment_id, start, start + timedelta(days=days, seconds=-1))


def episodes(url: str) -> dict[str, str]:
    engine = create_engine(url)
    try:
        return {
            e.allocation_key: str(e.episode_id) for e in EpisodeRepository(engine).list("weekly")
        }
    finally:
        engine.dispose()


def test_scheduled_slots_get_increasing_sequences_and_a_ui_retry_gets_the_same(
    harness: str,
) -> None:
    deployment_id = deploy("twice-weekly")
    monday, thursday = slots(deployment_id)
    assert monday.auto_scheduled and thursday.auto_scheduled
    assert local.execute(weekly_episode, monday.id).result() == "2026-W32-0"
    assert local.execute(weekly_episode, thursday.id).result() == "2026-W32-1"
    assert local.retry(weekly_episode, monday.id).result() == "2026-W32-0"
    assert episodes(harness) == {
        "slot:weekly:2026-08-03T09:00:00Z": "2026-W32-0",
        "slot:weekly:2026-08-06T09:00:00Z": "2026-W32-1",
    }


def test_flow_retries_after_a_crash_past_the_commit_get_the_same_episode(
    harness: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first attempt commits the allocation, then dies; Prefect's retry finds it again."""
    real_allocate = episodic.tasks.allocate.allocate
    calls: list[bool] = []

    def crash_after_first_commit(*args, **kwargs):  # type: ignore[no-untyped-def]
        allocation = real_allocate(*args, **kwargs)
        calls.append(allocation.created)
        if len(calls) == 1:
            raise RuntimeError("worker lost after the commit")
        return allocation

    monkeypatch.setattr(episodic.tasks.allocate, "allocate", crash_after_first_commit)
    (monday, _thursday) = slots(deploy("retrying"))
    state = local.execute(weekly_episode.with_options(retry_delay_seconds=0), monday.id)
    assert state.is_completed()
    assert state.result() == "2026-W32-0"
    assert calls == [True, False]  # one episode created, then found again
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(monday.id).run_count == 2
    assert len(episodes(harness)) == 1


def test_a_second_flow_run_for_the_same_slot_gets_the_same_episode(harness: str) -> None:
    deployment_id = deploy("recreated")
    monday, _ = slots(deployment_id)
    assert local.execute(weekly_episode, monday.id).result() == "2026-W32-0"
    with get_client(sync_client=True) as client:  # e.g. deleted and re-created by a redeploy
        client.delete_flow_run(monday.id)
    again, _ = slots(deployment_id)
    assert again.id != monday.id and again.expected_start_time == monday.expected_start_time
    assert local.execute(weekly_episode, again.id).result() == "2026-W32-0"
    assert len(episodes(harness)) == 1


def test_two_manual_runs_get_two_episodes(harness: str) -> None:
    deployment_id = deploy("manual")
    with get_client(sync_client=True) as client:  # the UI's "Run" button, twice
        runs = [
            client.create_flow_run_from_deployment(deployment_id, parameters={"week": "2026-W32"})
            for _ in range(2)
        ]
    assert not any(run.auto_scheduled for run in runs)
    results = [local.execute(weekly_episode, run.id).result() for run in runs]
    assert results == ["2026-W32-0", "2026-W32-1"]
    assert set(episodes(harness)) == {f"flow-run:{run.id}" for run in runs}
    assert local.retry(weekly_episode, runs[0].id).result() == "2026-W32-0"


def test_plain_calls_are_manual_runs_in_the_current_week(harness: str) -> None:
    first, second = weekly_episode(), weekly_episode()
    this_week = str(WeekId.of(datetime.now(UTC), UTC))
    assert (first, second) == (f"{this_week}-0", f"{this_week}-1")


def test_an_explicit_allocation_key_wins(harness: str) -> None:
    assert weekly_episode(allocation_key="replay:1", week="2026-W32") == "2026-W32-0"
    assert weekly_episode(allocation_key="replay:1", week="2026-W32") == "2026-W32-0"
    assert episodes(harness) == {"replay:1": "2026-W32-0"}


def test_week_is_computed_in_the_pipeline_timezone(
    harness: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Monday 00:30 in Berlin is Sunday 22:30 UTC, the previous ISO week in UTC."""
    monkeypatch.setenv("EPISODIC_TIMEZONE", "Europe/Berlin")
    deployment_id = deploy("berlin", cron="30 0 * * 1", timezone="Europe/Berlin")
    (run,) = slots(deployment_id, start=datetime(2026, 8, 2, 12, tzinfo=UTC), days=2)
    assert run.expected_start_time == datetime(2026, 8, 2, 22, 30, tzinfo=UTC)
    assert local.execute(weekly_episode, run.id).result() == "2026-W32-0"


def test_a_conflicting_explicit_key_fails_the_flow_and_writes_nothing(harness: str) -> None:
    assert weekly_episode(allocation_key="k", week="2026-W32") == "2026-W32-0"
    state = weekly_episode(allocation_key="k", week="2026-W33", return_state=True)
    assert state.is_failed()
    assert episodes(harness) == {"k": "2026-W32-0"}


def test_the_key_cannot_be_derived_outside_a_flow_run() -> None:
    from episodic.core.keys import derive_allocation_key
    from episodic.flows.invocation import current_invocation

    assert current_invocation() is None
    with pytest.raises(NoInvocationIdentity):
        derive_allocation_key(current_invocation(), pipeline="weekly")


def test_the_weekly_flow_plans_from_a_playlist_parameter(harness: str, tmp_path: Path) -> None:
    from episodic.storage.engine import make_engine
    from episodic.storage.plans import PlanStore
    from tests.generation import write_playlist

    playlist = write_playlist(tmp_path / "pl", ["a", "b"])
    assert (
        weekly_episode(allocation_key="k", week="2026-W32", playlist=str(playlist), generate=False)
        == "2026-W32-0"
    )
    engine = make_engine(harness)
    plans = PlanStore(engine)
    episodes = EpisodeRepository(engine)
    recorded = plans.latest_plan(episodes.episode_pk("weekly", "2026-W32-0"))
    engine.dispose()
    assert recorded is not None and [v["video_id"] for v in recorded[0]["items"]] == ["v01", "v02"]


def test_a_playlist_that_does_not_exist_is_refused_before_any_episode_is_allocated(
    harness: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relative `playlist` that is not there (a worker's flow run starts in a folder the
    person who typed the path did not have in mind): the run fails naming the absolute path
    it looked for, and no episode exists for the slot afterwards."""
    from episodic.core.errors import InvalidPlaylist

    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidPlaylist) as refused:
        weekly_episode(allocation_key="k-missing", week="2026-W32", playlist="pl/playlist.yaml")
    looked = tmp_path / "pl" / "playlist.yaml"
    assert f"playlist pl/playlist.yaml (looked for {looked}): does not exist" in str(refused.value)
    assert "k-missing" not in episodes(harness)


def test_a_rerun_whose_plan_is_recorded_goes_on_when_the_playlist_file_is_gone(
    harness: str, tmp_path: Path
) -> None:
    """The check before allocating never stops a key that already owns its episode: its plan
    is recorded, and a rerun does not read the file again."""
    from tests.generation import write_playlist

    playlist = write_playlist(tmp_path / "pl", ["a"])
    kw = {"allocation_key": "k-gone", "week": "2026-W32", "generate": False}
    first = weekly_episode(playlist=str(playlist), **kw)
    playlist.unlink()
    assert weekly_episode(playlist=str(playlist), **kw) == first
    assert episodes(harness)["k-gone"] == first
