"""One episode per pipeline slot, under the Prefect test harness.

Two deployments of the weekly flow on one pipeline with the same cron (a copy, a renamed
one left behind) make two scheduled runs per slot; both belong to the same episode, and
the provider makes one job per image. Money is counted at the fake provider (its jobs).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path
from uuid import UUID, uuid4

import pytest
from prefect.schedules import Cron
from sqlalchemy import update

from episodic.flows import local
from episodic.flows.weekly import weekly_episode
from episodic.pipeline.slot_warnings import schedule_warnings
from episodic.storage.engine import make_engine
from episodic.storage.episodes import EpisodeRepository
from episodic.storage.models import EpisodeRow
from tests.generation import made_jobs_per_key, write_playlist

pytestmark = pytest.mark.slow

WEEK_START = datetime(2026, 8, 3, tzinfo=UTC)  # Monday of 2026-W32


def deploy(name: str, playlist: Path) -> tuple[UUID, str]:
    name = f"{name}-{uuid4().hex[:8]}"
    schedule = Cron("0 9 * * 1", timezone="UTC", slug=f"{name}-monday")
    parameters = {"playlist": str(playlist), "wait_for_approval": False}
    return local.apply_deployment(weekly_episode, name, schedule, parameters), name


def monday_run(deployment_id: UUID):  # type: ignore[no-untyped-def]
    (run,) = local.schedule_slots(deployment_id, WEEK_START, WEEK_START + timedelta(days=1))
    assert run.auto_scheduled
    return run


def episodes(url: str) -> dict[str, str]:
    engine = make_engine(url)
    try:
        return {
            e.allocation_key: str(e.episode_id) for e in EpisodeRepository(engine).list("weekly")
        }
    finally:
        engine.dispose()


def test_two_deployments_scheduling_one_pipeline_get_one_episode_and_pay_once(
    harness: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    playlist = write_playlist(tmp_path / "pl", ["a", "b"])
    weekly, weekly_name = deploy("weekly", playlist)
    copy, copy_name = deploy("weekly-copy", playlist)
    first, second = monday_run(weekly), monday_run(copy)
    assert first.expected_start_time == second.expected_start_time
    assert local.execute(weekly_episode, first.id).result() == "2026-W32-0"
    assert local.execute(weekly_episode, second.id).result() == "2026-W32-0"
    (joined,) = [r for r in caplog.records if "scheduled by 2 deployments" in r.getMessage()]
    assert str(getattr(joined, "flow_run_id", None)) == str(second.id)  # the run that joined
    said = [r.getMessage() for r in caplog.records]
    assert "plan of 2026-W32-0 recorded: 2 images for 2 videos, provider profile fake" in (
        " ".join(said)
    )
    assert not [m for m in said if "{'" in m or "': " in m]  # words, never a Python dict
    assert episodes(harness) == {"slot:weekly:2026-08-03T09:00:00Z": "2026-W32-0"}
    jobs = made_jobs_per_key()
    assert len(jobs) == 2 and set(jobs.values()) == {1}  # one provider job per image
    engine = make_engine(harness)
    (warning,) = schedule_warnings(engine, "weekly")
    engine.dispose()
    names = " and ".join(sorted(f"weekly-episode/{n}" for n in (weekly_name, copy_name)))
    assert f"was asked for by deployments {names}" in warning.detail


def test_a_retry_of_a_slot_allocated_under_the_old_key_finds_its_episode(
    harness: str, tmp_path: Path
) -> None:
    """The episode was allocated (and paid for) before the upgrade, under
    scheduled:{flow}/{deployment}:{slot}; a Retry of that run after the upgrade asks with the
    new key, finds it and pays nothing."""
    playlist = write_playlist(tmp_path / "pl", ["a", "b"])
    deployment_id, name = deploy("upgraded", playlist)
    run = monday_run(deployment_id)
    assert local.execute(weekly_episode, run.id).result() == "2026-W32-0"
    old_key = f"scheduled:weekly-episode/{name}:2026-08-03T09:00:00Z"
    engine = make_engine(harness)
    with engine.begin() as conn:  # as the old code keyed it
        conn.execute(update(EpisodeRow).values(allocation_key=old_key))
    engine.dispose()
    paid = made_jobs_per_key()
    assert local.retry(weekly_episode, run.id).result() == "2026-W32-0"
    assert episodes(harness) == {old_key: "2026-W32-0"}
    assert made_jobs_per_key() == paid and sum(paid.values()) == 2
