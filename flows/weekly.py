"""`weekly_episode`: the scheduled entry point, and the whole chain behind it.

Derive the invocation's allocation key (the pipeline's scheduled slot, or flow run id, or
the explicit parameter), compute the ISO week of the slot in the pipeline's timezone
(recorded in the database: `episodic.pipeline.pipelines`), allocate. Every retry of the flow run,
every flow run re-created for the slot, a run of another deployment scheduling the same
pipeline at the same moment and a replay of the slot (`allocation_key=slot:…`, `episodic
replay`) get the same episode. With a playlist the run
goes on: plan → generate (paid, never twice) → wait for approval (suspended, no worker held)
→ assemble. A duplicate run of one slot finds the episode and the work already done, or
already waiting for a decision, and ends green ("Joined").
"""

from __future__ import annotations

import logging
import re
from datetime import UTC
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.schedules import CronSchedule
from prefect.context import FlowRunContext
from prefect.logging import get_run_logger

from episodic.core.errors import ScheduleOutOfDate
from episodic.core.hints import surface
from episodic.core.ids import WeekId
from episodic.core.keys import SlotKey, derive_allocation_key
from episodic.core.schedule_slots import allocation_week
from episodic.core.settings import load_settings, validate_pipeline
from episodic.flows.artifacts import publish_week_spend
from episodic.flows.cancellation import settle_hook
from episodic.flows.generate import generate_episode
from episodic.flows.invocation import current_invocation
from episodic.flows.params import (
    APPROVAL_TIMEOUT_DEFAULT_S,
    ApprovalTimeoutParam,
    Flag,
    KeyParam,
    PipelineParam,
    PlaylistParam,
    WeekParam,
)
from episodic.flows.review import approval_step, assemble_step, decision_state
from episodic.pipeline.episode_plan import refuse_unreadable_playlist
from episodic.pipeline.pipelines import pipeline_timezone
from episodic.storage.registry import engine_for
from episodic.tasks.allocate import allocate_episode
from episodic.tasks.plan import plan_episode

FLOW_NAME = "weekly-episode"


def weekly_run_name() -> str:
    """`weekly 2026-W32` for an explicit week, else the slot (UTC: the scheduled one, or the
    one a replay's allocation key names), else `weekly manual run 2026-08-03 09:00 UTC` for
    a run a person started (Quick run, `prefect deployment run`): no slot is involved. The
    name holds until allocation renames the run after its episode."""
    from prefect.runtime import flow_run

    parameters = flow_run.parameters
    pipeline = parameters.get("pipeline") or "weekly"
    current = flow_run.name  # a retry or a resumed run: keep the episode's name from the start
    if current and re.fullmatch(rf"{re.escape(pipeline)} \d{{4}}-W\d{{2}}-\d+( · .*)?", current):
        return str(current)
    if parameters.get("week"):
        return f"{pipeline} {parameters['week']}"
    key = parameters.get("allocation_key")
    named = SlotKey.parse(key) if isinstance(key, str) else None
    if named is not None:
        return f"{pipeline} slot {named.moment:%Y-%m-%d %H:%M} UTC (replay)"
    start = flow_run.scheduled_start_time.astimezone(UTC)
    context = FlowRunContext.get()
    run = context.flow_run if context is not None else None
    if run is not None and not run.auto_scheduled:
        return f"{pipeline} manual run {start:%Y-%m-%d %H:%M} UTC"
    return f"{pipeline} slot {start:%Y-%m-%d %H:%M} UTC"


@flow(
    name=FLOW_NAME,
    retries=1,
    retry_delay_seconds=10,
    validate_parameters=True,
    flow_run_name=weekly_run_name,
    on_cancellation=[settle_hook],
)
def weekly_episode(
    allocation_key: KeyParam = None,
    week: WeekParam = None,
    pipeline: PipelineParam = None,
    playlist: PlaylistParam = None,
    generate: Flag = True,
    wait_for_approval: Flag = True,
    approval_timeout_s: ApprovalTimeoutParam = APPROVAL_TIMEOUT_DEFAULT_S,
) -> Any:
    """Allocate this invocation's episode and, with a playlist, run the whole chain.

    Returns the episode id; a rejected episode ends in a Completed state named "Rejected",
    and a duplicate run whose episode already waits for a decision in "Joined".

    Args:
        allocation_key: explicit invocation identity (replays); default: derived from the
            scheduled slot, or from the flow run for a manual run.
        week: ISO week such as 2026-W32; default: the week of the scheduled start time in
            the pipeline's timezone.
        pipeline: pipeline name; default: EPISODIC_PIPELINE.
        playlist: playlist YAML to record as the episode's plan (relative paths resolve in
            the project folder). Without it the run only allocates.
        generate: with a playlist, run the paid generation (False: only plan).
        wait_for_approval: suspend for a person's decision after generation, then assemble.
        approval_timeout_s: seconds the approval form waits before the run fails.
    """
    with surface("prefect"):
        return _weekly(
            allocation_key,
            week,
            pipeline,
            playlist,
            generate,
            wait_for_approval,
            approval_timeout_s,
        )


def _weekly(
    allocation_key: str | None,
    week: str | None,
    pipeline: str | None,
    playlist: str | None,
    generate: bool,
    wait_for_approval: bool,
    approval_timeout_s: int,
) -> Any:
    logger = get_run_logger()
    settings = load_settings()
    pipeline_name = validate_pipeline(pipeline or settings.pipeline)
    invocation = current_invocation()
    # bad input: refused before any database access
    key = derive_allocation_key(invocation, allocation_key, pipeline=pipeline_name)
    explicit_week = WeekId.parse(week) if week is not None else None
    named_slot = SlotKey.parse(key)
    tz = pipeline_timezone(engine_for(settings), settings, pipeline_name)  # before allocating
    _check_schedule_zone(pipeline_name, str(tz))
    start = invocation.expected_start_time if invocation is not None else None
    allocation_for = allocation_week(key, tz, stated=explicit_week, moment=start)
    week_id, slot = allocation_for.week, allocation_for.moment
    if playlist is not None:  # a wrong path is found before the slot's episode exists
        refuse_unreadable_playlist(engine_for(settings), pipeline_name, key, Path(playlist))
    scheduled_by = None
    if named_slot is not None and invocation is not None and invocation.auto_scheduled:
        scheduled_by = f"{invocation.flow_name}/{invocation.deployment_name}"
    allocation = allocate_episode(pipeline_name, str(week_id), key, scheduled_by)
    episode_id: str = allocation["episode_id"]
    logger.info("invocation %s owns episode %s (pipeline %s)", key, episode_id, pipeline_name)
    _rename(f"{pipeline_name} {episode_id}" + (f" · {slot:%a %H:%M %Z}" if slot else ""))
    if playlist is None:
        return episode_id
    planned = plan_episode(pipeline_name, episode_id, playlist)
    logger.info(
        "plan of %s %s: %d images for %d videos, provider profile %s, template %s",
        episode_id,
        "recorded" if planned["recorded"] else "as recorded before",
        planned["images"],
        planned["videos"],
        planned["provider_profile"],
        planned["template"],
    )
    if not generate:
        return episode_id
    try:  # the generate subflow logs its outcome and the episode's figures in words
        generate_episode(episode_id=episode_id, pipeline=pipeline_name)
    finally:  # the week's spend, whatever the generation's end (a budget refusal too)
        publish_week_spend(engine_for(settings), pipeline_name, str(week_id))
    if not wait_for_approval:
        return episode_id
    answer, recorded = approval_step(episode_id, pipeline_name, approval_timeout_s)
    if answer is not None and answer.decision == "approve":
        assembled = assemble_step(episode_id, pipeline_name)
        logger.info("assembled %s: cover %s", episode_id, assembled["cover"])
    return decision_state(episode_id, answer, episode_id, recorded)


def _check_schedule_zone(pipeline: str, recorded: str) -> None:
    """A scheduled run refuses when its deployment's cron schedules are in another zone than
    the pipeline's recorded one (`episodic pipelines set-timezone` without a redeploy)."""
    context = FlowRunContext.get()
    run = context.flow_run if context else None
    if run is None or not run.auto_scheduled or run.deployment_id is None:
        return
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment(run.deployment_id)
    zones = {
        str(zone)
        for schedule in deployment.schedules
        if isinstance(schedule.schedule, CronSchedule)
        and (zone := schedule.schedule.timezone) is not None
    }
    stale = sorted(zones - {recorded})
    if stale:
        raise ScheduleOutOfDate(
            f"the schedules of deployment {deployment.name} run in {', '.join(stale)}, but "
            f"pipeline {pipeline} is recorded in {recorded}: redeploy (`episodic serve` or "
            "`prefect deploy --all`) so the slots fall in the right weeks"
        )


class _RenamedRuns(logging.Filter):
    """Gives log records the flow run's new name. Prefect's run loggers copy the run's name
    when they are made (the engine's own, which logs "Finished in state …", is made before
    the flow starts and cannot be reached), so without this every later line, on a worker's
    console too, kept the slot name the run had before allocation."""

    def __init__(self) -> None:
        super().__init__()
        self.names: dict[str, str] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        name = self.names.get(str(getattr(record, "flow_run_id", None)))
        if name is not None:
            record.flow_run_name = name
        return True

    def rename(self, flow_run_id: str, name: str) -> None:
        if len(self.names) >= 1024:  # a long-lived `serve` process: keep the latest runs
            self.names.pop(next(iter(self.names)))
        self.names[flow_run_id] = name


_RENAMED = _RenamedRuns()
for _logger_name in ("prefect.flow_runs", "prefect.task_runs"):
    logging.getLogger(_logger_name).addFilter(_RENAMED)


def _rename(name: str) -> None:
    """Name the flow run after its episode (the UI's run list then reads like the ledger),
    and every log line from here on with it: loggers made later read the context's run,
    records of loggers made before are renamed by `_RenamedRuns`."""
    context = FlowRunContext.get()
    if context is None or context.flow_run is None:
        return
    flow_run = context.flow_run
    _RENAMED.rename(str(flow_run.id), name)
    if flow_run.name == name:
        return
    with get_client(sync_client=True) as client:
        client.update_flow_run(flow_run.id, name=name)
    flow_run.name = name
