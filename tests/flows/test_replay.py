"""`episodic replay --slot`: a slot's weekly chain now, with its scheduled run's identity
(the UI's Quick run, Copy to new run and `prefect deployment run` are manual runs, each
buying a new episode). The command runs as a person types it, against the harness's
API server; money is counted at the fake provider (its jobs)."""

from __future__ import annotations

import json
import os
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from uuid import UUID, uuid4

import pytest
from prefect.client.orchestration import get_client
from prefect.schedules import Cron

from episodic.flows import local
from episodic.flows.weekly import weekly_episode
from tests.acceptance.conftest import EPISODIC
from tests.generation import made_jobs_per_key, write_playlist

pytestmark = pytest.mark.slow

WEEK_START = datetime(2026, 8, 3, tzinfo=UTC)  # Monday of 2026-W32
THURSDAY = "2026-08-06T11:00:00+02:00"  # 09:00 UTC: the weekly schedule's Thursday slot


def replay(*args: str) -> subprocess.CompletedProcess[str]:
    from prefect.settings import PREFECT_API_URL

    assert EPISODIC is not None
    env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value())}
    return subprocess.run(
        [EPISODIC, "replay", *args], capture_output=True, text=True, env=env, timeout=300
    )


def deploy(playlist: Path) -> tuple[UUID, str]:
    name = f"replayed-{uuid4().hex[:8]}"
    schedule = Cron("0 9 * * 4", timezone="UTC", slug=f"{name}-thursday")
    parameters = {"playlist": str(playlist), "wait_for_approval": False}
    return local.apply_deployment(weekly_episode, name, schedule, parameters), name


def test_a_replay_repeated_is_the_same_episode_and_pays_once(harness: str, tmp_path: Path) -> None:
    playlist = write_playlist(tmp_path / "pl", ["a", "b"])
    first = replay("--slot", THURSDAY, "--playlist", str(playlist))
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines() == [
        "slot slot:weekly:2026-08-06T09:00:00Z: episode 2026-W32-0, generated",
        "next: episodic approve 2026-W32-0 --by NAME [--reject --reason R]",
    ]
    again = replay("--slot", "2026-08-06T09:00:00Z", "--playlist", str(playlist), "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["episode_id"] == "2026-W32-0"
    jobs = made_jobs_per_key()
    assert len(jobs) == 2 and set(jobs.values()) == {1}


def test_a_replay_of_a_slot_the_scheduler_ran_is_that_episode(harness: str, tmp_path: Path) -> None:
    playlist = write_playlist(tmp_path / "pl", ["a", "b"])
    deployment_id, name = deploy(playlist)
    (run,) = local.schedule_slots(deployment_id, WEEK_START, WEEK_START + timedelta(days=7))
    assert local.execute(weekly_episode, run.id).result() == "2026-W32-0"
    paid = made_jobs_per_key()
    here = replay("--slot", THURSDAY, "--json")  # no playlist: the episode has its plan
    assert here.returncode == 0, here.stderr
    assert json.loads(here.stdout)["episode_id"] == "2026-W32-0"
    handed = replay("--slot", THURSDAY, "--deployment", f"weekly-episode/{name}", "--json")
    assert handed.returncode == 0, handed.stderr
    created = json.loads(handed.stdout)
    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(UUID(created["flow_run_id"]))
    assert flow_run.parameters["allocation_key"] == "slot:weekly:2026-08-06T09:00:00Z"
    assert flow_run.name == "weekly slot 2026-08-06 09:00 UTC (replay)"  # not a random name
    assert local.execute(weekly_episode, flow_run.id).result() == "2026-W32-0"  # a worker's run
    assert made_jobs_per_key() == paid and sum(paid.values()) == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--slot", "2026-08-06T09:00:00"], "has no UTC offset"),
        (["--slot", "thursday"], "is not an ISO-8601 date-time"),
        (["--slot", THURSDAY, "--playlist", "missing.yaml"], "not found"),
        (["--slot", THURSDAY, "--deployment", "generate-episode/generate"], "weekly flow"),
        (["--slot", THURSDAY, "--deployment", "weekly-episode/none"], "no deployment"),
        # a forgotten offset, another hour or a sub-second moment would allocate, and pay
        # for, an episode of a slot no schedule has
        (["--slot", "2026-08-06T09:00:00+02:00"], "is not a slot of the weekly schedule"),
        (["--slot", "2026-08-05T03:17:00Z"], "is not a slot of the weekly schedule"),
        (["--slot", "2026-08-06T09:00:00.5Z"], "is not a whole second"),
        (["--slot", "0001-01-01T00:00:00+14:00"], "outside the years"),
        (["--slot", "9999-12-31T23:59:59+00:00"], "outside the years"),
    ],
)
def test_a_replay_of_no_moment_or_of_no_weekly_deployment_is_refused(
    prefect_harness: None, args: list[str], message: str
) -> None:
    refused = replay(*args)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    (line,) = refused.stderr.splitlines()
    assert line.startswith("error: ") and message in line


def test_a_replay_off_the_deployments_schedule_is_refused_unless_asked_for(
    harness: str, tmp_path: Path
) -> None:
    """The slot is held against the deployment's own crons (here Thursday 09:00 UTC):
    Wednesday is refused and pays nothing; --off-schedule replays it on purpose."""
    playlist = write_playlist(tmp_path / "pl", ["a"])
    _, name = deploy(playlist)
    wednesday = "2026-08-05T09:00:00Z"
    refused = replay("--slot", wednesday, "--deployment", f"weekly-episode/{name}")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    (line,) = refused.stderr.splitlines()
    assert f"is not a slot of weekly-episode/{name} (0 9 * * 4 (UTC))" in line
    assert made_jobs_per_key() == {}
    here = replay("--slot", wednesday, "--playlist", str(playlist), "--off-schedule", "--json")
    assert here.returncode == 0, here.stderr
    assert json.loads(here.stdout)["allocation_key"] == "slot:weekly:2026-08-05T09:00:00Z"
