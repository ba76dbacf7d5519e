"""Serve every deployment of this project from one process (`episodic serve`).

Each schedule has a `slug`, so redeploying keeps its schedule id stable and already
scheduled slots are not duplicated.
"""

from __future__ import annotations

from prefect import serve
from prefect.deployments.runner import RunnerDeployment
from prefect.schedules import Cron, Interval, Schedule

from core.settings import load_settings
from flows.generate import generate_episode
from flows.limits import ensure_provider_limit
from flows.maintenance import cancel_stale
from flows.review import approve_episode, assemble_episode
from flows.weekly import weekly_episode
from providers.profiles import load_profiles

WEEKLY_CRON = "30 0 * * 1"  # Mondays 00:30 in EPISODIC_TIMEZONE
SWEEP_EVERY_S = 300


def weekly_schedule(timezone: str) -> Schedule:
    return Cron(WEEKLY_CRON, timezone=timezone, slug="weekly-monday-0030")


def all_deployments() -> list[RunnerDeployment]:
    settings = load_settings()
    weekly = weekly_episode.to_deployment(
        name="weekly",
        schedules=[weekly_schedule(settings.timezone)],
        description="Allocate this week's episode (one per scheduled slot, retry-safe).",
    )
    others = [
        generate_episode.to_deployment(
            name="generate",
            description="Generate an existing episode's images (episode_id is required).",
        ),
        approve_episode.to_deployment(
            name="approve", description="Wait for a person's decision on a generated episode."
        ),
        assemble_episode.to_deployment(
            name="assemble", description="Assemble an approved episode (reruns change nothing)."
        ),
        cancel_stale.to_deployment(
            name="cancel-stale",
            schedules=[Interval(SWEEP_EVERY_S, slug="sweep-every-5-min")],
            description="The stale sweep: expired leases, never-started runs, stuck flow runs.",
        ),
    ]
    deployments = [weekly, *others]
    for deployment in deployments:
        assert isinstance(deployment, RunnerDeployment)  # sync context: not a coroutine
    return deployments  # type: ignore[return-value]


def ensure_limits() -> None:
    """One global concurrency limit per provider profile (paid tasks acquire it strictly)."""
    settings = load_settings()
    for profile in load_profiles(settings.providers_path).values():
        ensure_provider_limit(profile.id, profile.max_concurrency)


def serve_all() -> None:
    ensure_limits()
    serve(*all_deployments())


if __name__ == "__main__":
    serve_all()
