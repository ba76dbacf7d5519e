"""The Prefect task over the allocator."""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.logging import get_run_logger

from episodic.core.ids import WeekId
from episodic.core.settings import load_settings
from episodic.pipeline.allocation import allocate
from episodic.storage.registry import engine_for


@task(name="allocate-episode", cache_policy=NO_CACHE, retries=0)
def allocate_episode(
    pipeline: str, week_id: str, allocation_key: str, scheduled_by: str | None = None
) -> dict[str, Any]:
    """Allocate (or find again) the episode owned by ``allocation_key``.

    Idempotent by construction, so it is never cached: the database is the answer.
    Transient database errors are retried inside (tenacity); a conflict is raised as is.
    ``scheduled_by`` (the deployment whose schedule made this run) is recorded; when
    another deployment already asked for the same slot, the run log warns.
    """
    logger = get_run_logger()
    engine = engine_for(load_settings())
    allocation = allocate(
        engine, pipeline, WeekId.parse(week_id), allocation_key, scheduled_by=scheduled_by
    )
    logger.info(
        "%s episode %s for key %s",
        "allocated" if allocation.created else "found existing",
        allocation.episode.episode_id,
        allocation_key,
    )
    if len(allocation.scheduled_by) > 1:
        logger.warning(
            "slot %s of pipeline %s is scheduled by %d deployments (%s): this run joins "
            "episode %s and pays nothing twice; keep one deployment of the weekly flow per "
            "pipeline (`prefect deployment delete FLOW/DEPLOYMENT` for the others)",
            allocation_key,
            pipeline,
            len(allocation.scheduled_by),
            ", ".join(allocation.scheduled_by),
            allocation.episode.episode_id,
        )
    return allocation.to_dict()
