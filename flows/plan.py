"""`plan_episode_flow`: record a playlist as an existing episode's plan (spends nothing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow
from prefect.logging import get_run_logger

from episodic.core.hints import surface
from episodic.core.settings import load_settings
from episodic.flows.params import EpisodeIdParam, PipelineParam, Playlist, episode_run_name
from episodic.pipeline.episode_plan import record_plan
from episodic.storage.registry import engine_for


@flow(
    name="plan-episode",
    validate_parameters=True,
    flow_run_name=episode_run_name("plan"),
)
def plan_episode_flow(
    episode_id: EpisodeIdParam,
    playlist: Playlist,
    pipeline: PipelineParam = None,
) -> dict[str, Any]:
    """Validate a playlist and record it as the episode's plan (re-planning is allowed until
    the episode is approved; an approved plan is frozen).

    Args:
        episode_id: an existing episode, e.g. 2026-W32-1.
        playlist: playlist YAML (relative paths resolve in the project folder).
        pipeline: pipeline name; default: EPISODIC_PIPELINE.
    """
    with surface("prefect"):
        settings = load_settings()
        name = pipeline or settings.pipeline
        summary = record_plan(
            engine_for(settings),
            name,
            episode_id,
            Path(playlist),
            providers_path=settings.providers_path,
        )
        get_run_logger().info("plan of %s: %s", episode_id, summary)
        return summary
