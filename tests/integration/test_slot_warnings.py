"""`episodic check` warns when more than one deployment asked for one pipeline's slot
from the database alone, on SQLite and Postgres."""

from __future__ import annotations

import json
import subprocess
import sys

from sqlalchemy import Engine, update

from episodic.core.ids import WeekId
from episodic.pipeline.check import check_episodes
from episodic.pipeline.slot_warnings import schedule_warnings
from episodic.storage.allocator import Allocator
from episodic.storage.models import EpisodeRow

W32 = WeekId.parse("2026-W32")
SLOT = "2026-08-06T07:00:00Z"


def test_two_deployments_asking_for_one_slot_are_named(engine: Engine) -> None:
    allocator = Allocator(engine)
    allocator.allocate("weekly", W32, f"slot:weekly:{SLOT}", scheduled_by="weekly-episode/weekly")
    assert schedule_warnings(engine, "weekly") == []
    allocator.allocate("weekly", W32, f"slot:weekly:{SLOT}", scheduled_by="weekly-episode/copy")
    allocator.allocate("weekly", W32, "slot:weekly:2026-08-03T07:00:00Z", scheduled_by="w/one")
    (warning,) = schedule_warnings(engine, "weekly")
    assert warning.episode_id == "2026-W32-0" and warning.check == "schedule"
    assert (
        f"slot {SLOT} of pipeline weekly was asked for by deployments weekly-episode/copy "
        "and weekly-episode/weekly (episode 2026-W32-0)" in warning.detail
    )
    assert schedule_warnings(engine, "weekly", "2026-W32-0") == [warning]
    assert schedule_warnings(engine, "weekly", "2026-W32-1") == []
    assert schedule_warnings(engine, "other") == []
    assert check_episodes(engine, "weekly") == []  # a warning, not a finding


def test_a_replay_or_a_retry_of_the_same_deployment_is_no_warning(engine: Engine) -> None:
    allocator = Allocator(engine)
    for by in ("weekly-episode/weekly", None, "weekly-episode/weekly"):
        allocator.allocate("weekly", W32, f"slot:weekly:{SLOT}", scheduled_by=by)
    assert schedule_warnings(engine, "weekly") == []


def test_episodes_two_deployments_allocated_before_the_upgrade_are_named(
    engine: Engine, database_url: str
) -> None:
    for n, deployment in enumerate(["weekly", "weekly-copy"]):
        Allocator(engine).allocate("weekly", W32, f"placeholder-{n}")
        with engine.begin() as conn:  # as the old code keyed them
            conn.execute(
                update(EpisodeRow)
                .where(EpisodeRow.allocation_key == f"placeholder-{n}")
                .values(allocation_key=f"scheduled:weekly-episode/{deployment}:{SLOT}")
            )
    (warning,) = schedule_warnings(engine, "weekly", "2026-W32-1")
    assert "deployments weekly-episode/weekly and weekly-episode/weekly-copy" in warning.detail
    assert "episodes 2026-W32-0, 2026-W32-1" in warning.detail
    result = subprocess.run(  # the command: a warning line, exit 0 (nothing is broken)
        [sys.executable, "-m", "episodic.cli.app", "check", "--all"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"2026-W32-0: warning: schedule: {warning.detail}",
        "clean",
    ]
    as_json = subprocess.run(
        [sys.executable, "-m", "episodic.cli.app", "check", "--all", "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert as_json.returncode == 0, as_json.stderr
    answer = json.loads(as_json.stdout)
    assert answer.pop("spend")["verified"] is True  # check's spend totals
    assert answer == {
        "clean": True,
        "findings": [],
        "warnings": [warning.to_dict()],
    }


def test_allocate_refuses_a_slot_key_in_another_week(database_url: str) -> None:
    """`episodic allocate --key slot:…` in a week that is not the slot's would leave the
    slot's own run an `AllocationConflict`: refused, nothing written."""
    args = [sys.executable, "-m", "episodic.cli.app", "allocate", "--key", f"slot:weekly:{SLOT}"]
    wrong = subprocess.run([*args, "--week", "2026-W33"], capture_output=True, text=True)
    assert wrong.returncode == 2, wrong.stderr
    assert "names a slot of 2026-W32" in wrong.stderr
    right = subprocess.run([*args, "--week", "2026-W32"], capture_output=True, text=True)
    assert right.returncode == 0 and right.stdout == "2026-W32-0 (new)\n", right.stderr
