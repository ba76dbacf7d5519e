"""Serve every deployment of this project from one process (`episodic serve`).

Each schedule has a `slug`, so redeploying keeps its schedule id stable and already
scheduled slots are not duplicated.
"""

from __future__ import annotations

from prefect import serve
from prefect.deployments.runner import RunnerDeployment
from prefect.schedules import Cron, Schedule

from core.settings import load_settings
from flows.weekly import weekly_episode

WEEKLY_CRON = "30 0 * * 1"  # Mondays 00:30 in EPISODIC_TIMEZONE


def weekly_schedule(timezone: str) -> Schedule:
    return Cron(WEEKLY_CRON, timezone=timezone, slug="weekly-monday-0030")


def all_deployments() -> list[RunnerDeployment]:
    settings = load_settings()
    weekly = weekly_episode.to_deployment(
        name="weekly",
        schedules=[weekly_schedule(settings.timezone)],
        description="Allocate this week's episode (one per scheduled slot, retry-safe).",
    )
    assert isinstance(weekly, RunnerDeployment)  # sync context: not a coroutine
    return [weekly]


def serve_all() -> None:
    serve(*all_deployments())


if __name__ == "__main__":
    serve_all()
