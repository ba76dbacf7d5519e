"""The Prefect task that records an episode's playlist (spends nothing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from core.settings import load_settings
from pipeline.generation import record_plan
from storage.registry import engine_for


@task(name="plan-episode", cache_policy=NO_CACHE)
def plan_episode(pipeline: str, episode_id: str, playlist: str) -> dict[str, Any]:
    """Validate the playlist file and record it for the episode (unchanged: a no-op)."""
    return record_plan(engine_for(load_settings()), pipeline, episode_id, Path(playlist))
