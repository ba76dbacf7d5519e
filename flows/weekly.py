"""`weekly_episode`: the scheduled entry point.

Derive the invocation's allocation key (scheduled slot, or flow run id, or the explicit
parameter), compute the ISO week of the scheduled time in the pipeline's timezone, allocate.
Every retry of the flow run, and every flow run re-created for the same deployment slot,
gets the same episode.
"""

from __future__ import annotations

from prefect import flow
from prefect.logging import get_run_logger

from core.errors import NoInvocationIdentity
from core.ids import WeekId
from core.keys import derive_allocation_key
from core.settings import load_settings, validate_pipeline
from flows.generate import generate_episode
from flows.invocation import current_invocation
from flows.review import approval_step, assemble_episode
from tasks.allocate import allocate_episode
from tasks.plan import plan_episode

FLOW_NAME = "weekly-episode"


@flow(name=FLOW_NAME, retries=1, retry_delay_seconds=10, validate_parameters=True)
def weekly_episode(
    allocation_key: str | None = None,
    week: str | None = None,
    pipeline: str | None = None,
    playlist: str | None = None,
    generate: bool = True,
    wait_for_approval: bool = True,
    approval_timeout_s: int = 7 * 24 * 3600,
) -> str:
    """Allocate this invocation's episode and return its id.

    Args:
        allocation_key: explicit invocation identity (replays); default: derived from the run.
        week: ISO week such as 2026-W32; default: the week of the scheduled start time in
            EPISODIC_TIMEZONE.
        pipeline: pipeline name; default: EPISODIC_PIPELINE.
        playlist: path of a playlist YAML to record as the episode's plan. With a playlist the
            whole chain runs: generate (paid, never twice), wait for approval (the run
            suspends; resume it from the UI with a decision), assemble.
        generate: with a playlist, run the paid generation (False: only plan).
        wait_for_approval: suspend for a decision after generation (needs a deployment run).
    """
    logger = get_run_logger()
    settings = load_settings()
    pipeline_name = validate_pipeline(pipeline or settings.pipeline)
    invocation = current_invocation()
    key = derive_allocation_key(invocation, allocation_key)
    if week is not None:
        week_id = WeekId.parse(week)
    elif invocation is not None and invocation.expected_start_time is not None:
        week_id = WeekId.of(invocation.expected_start_time, settings.tz)
    else:
        raise NoInvocationIdentity("no scheduled time to take the week from: pass `week`")
    allocation = allocate_episode(pipeline_name, str(week_id), key)
    episode_id: str = allocation["episode_id"]
    logger.info("invocation %s owns episode %s (pipeline %s)", key, episode_id, pipeline_name)
    if playlist is None:
        return episode_id
    planned = plan_episode(pipeline_name, episode_id, playlist)
    logger.info("plan of %s: %s", episode_id, planned)
    if not generate:
        return episode_id
    generated = generate_episode(episode_id=episode_id, pipeline=pipeline_name)
    logger.info("generation of %s: %s", episode_id, generated)
    if not wait_for_approval:
        return episode_id
    answer = approval_step(episode_id, pipeline_name, approval_timeout_s)
    if answer.decision == "approve":
        assembled = assemble_episode(episode_id=episode_id, pipeline=pipeline_name)
        logger.info("assembled %s: cover %s", episode_id, assembled["cover"])
    else:
        logger.info("episode %s rejected by %s: %s", episode_id, answer.reviewer, answer.note)
    return episode_id
