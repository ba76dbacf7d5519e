"""The Prefect task that records an episode's playlist (spends nothing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from episodic.core.settings import load_settings
from episodic.pipeline.episode_plan import record_plan, recorded_plan_summary
from episodic.storage.registry import engine_for


@task(name="plan-episode", cache_policy=NO_CACHE)
def plan_episode(pipeline: str, episode_id: str, playlist: str) -> dict[str, Any]:
    """Record the playlist file as the episode's plan, once: when a plan is recorded already
    (a retried or resumed run, which starts again from the top) the file is not read again,
    so editing it while a run waits for approval changes nothing that run ships."""
    settings = load_settings()
    engine = engine_for(settings)
    recorded = recorded_plan_summary(engine, pipeline, episode_id)
    if recorded is not None:
        return recorded
    return record_plan(
        engine, pipeline, episode_id, Path(playlist), providers_path=settings.providers_path
    )
