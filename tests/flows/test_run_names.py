"""Log lines carry the weekly run's name after it is renamed to its episode (up to
"Finished in state", on a worker's console too, never the slot name from before the rename),
and a Retry or a resumed run keeps the episode's name from its first line."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from uuid import uuid4

import pytest
from prefect.schedules import Cron

from episodic.flows import local
from episodic.flows.weekly import weekly_episode

pytestmark = pytest.mark.slow

WEEK_START = datetime(2026, 8, 3, tzinfo=UTC)  # Monday of 2026-W32
EPISODE_NAME = "weekly 2026-W32-0 · Mon 09:00 UTC"


def names(caplog: pytest.LogCaptureFixture, flow_run_id: object) -> list[tuple[str, str]]:
    return [
        (str(getattr(r, "flow_run_name", None)), r.getMessage())
        for r in caplog.records
        if str(getattr(r, "flow_run_id", None)) == str(flow_run_id)
    ]


def test_lines_after_the_rename_and_every_line_of_a_retry_carry_the_episode_name(
    harness: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    name = f"named-{uuid4().hex[:8]}"
    deployment = local.apply_deployment(
        weekly_episode, name, Cron("0 9 * * 1", timezone="UTC", slug=f"{name}-monday")
    )
    (run,) = local.schedule_slots(deployment, WEEK_START, WEEK_START + timedelta(days=1))
    assert local.execute(weekly_episode, run.id).result() == "2026-W32-0"
    lines = names(caplog, run.id)
    (owns,) = [i for i, (_, message) in enumerate(lines) if "owns episode" in message]
    assert lines[0][0] == "weekly slot 2026-08-03 09:00 UTC"  # before allocation
    after = lines[owns + 1 :]
    assert any(message.startswith("Finished in state") for _, message in after)
    assert {line_name for line_name, _ in after} == {EPISODE_NAME}, after

    caplog.clear()
    assert local.retry(weekly_episode, run.id).result() == "2026-W32-0"
    retried = names(caplog, run.id)
    assert retried and {line_name for line_name, _ in retried} == {EPISODE_NAME}, retried


def test_a_run_a_person_started_is_named_a_manual_run_not_a_slot(
    harness: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A Quick run (created from the deployment, not by its schedule) has no slot: its name
    says it is a manual run until allocation renames it after its episode."""
    from prefect.client.orchestration import get_client

    caplog.set_level(logging.INFO)
    name = f"manual-{uuid4().hex[:8]}"
    deployment = local.apply_deployment(
        weekly_episode, name, Cron("0 9 * * 1", timezone="UTC", slug=f"{name}-monday")
    )
    with get_client(sync_client=True) as client:  # what the UI's Quick run does
        run = client.create_flow_run_from_deployment(deployment)
    assert not run.auto_scheduled
    local.execute(weekly_episode, run.id)
    lines = names(caplog, run.id)
    first = lines[0][0]
    assert first.startswith("weekly manual run ") and first.endswith(" UTC"), lines[0]
    assert "slot" not in first
