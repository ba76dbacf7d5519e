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
from flows.invocation import current_invocation
from tasks.allocate import allocate_episode
from tasks.plan import plan_episode

FLOW_NAME = "weekly-episode"


@flow(name=FLOW_NAME, retries=1, retry_delay_seconds=10, validate_parameters=True)
def weekly_episode(
    allocation_key: str | None = None,
    week: str | None = None,
    pipeline: str | None = None,
    playlist: str | None = None,
) -> str:
    """Allocate this invocation's episode and return its id.

    Args:
        allocation_key: explicit invocation identity (replays); default: derived from the run.
        week: ISO week such as 2026-W32; default: the week of the scheduled start time in
            EPISODIC_TIMEZONE.
        pipeline: pipeline name; default: EPISODIC_PIPELINE.
        playlist: path of a playlist YAML to record as the episode's plan (spends nothing).
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
    if playlist is not None:
        planned = plan_episode(pipeline_name, episode_id, playlist)
        logger.info("plan of %s: %s", episode_id, planned)
    return episode_id
