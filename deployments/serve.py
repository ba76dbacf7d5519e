"""Serve every deployment of this project from one process (`episodic serve`).

The deployments are `episodic.deployments.spec` (the same as `prefect.yaml`); `prefect_setup` runs
first (limits, the pipeline's recorded timezone the weekly schedules use). Each schedule has
a `slug`, so redeploying keeps its schedule id stable and already scheduled slots are not
duplicated.
"""

from __future__ import annotations

import sys
from typing import Any

from prefect import Flow, serve
from prefect.deployments.runner import RunnerDeployment
from prefect.schedules import Cron, Interval, Schedule

from episodic.deployments.setup import prefect_setup
from episodic.deployments.spec import (
    DEFAULT_PLAYLIST,
    SWEEP_EVERY_S,
    SWEEP_SLUG,
    WEEKLY_SLOTS,
    DeploymentSpec,
    deployment_specs,
    project_version,
)
from episodic.flows.generate import generate_episode
from episodic.flows.maintenance import cancel_stale
from episodic.flows.plan import plan_episode_flow
from episodic.flows.review import approve_episode, assemble_episode
from episodic.flows.weekly import weekly_episode

FLOWS: dict[str, Flow[Any, Any]] = {
    "weekly-episode": weekly_episode,
    "plan-episode": plan_episode_flow,
    "generate-episode": generate_episode,
    "approve-episode": approve_episode,
    "assemble-episode": assemble_episode,
    "sweep": cancel_stale,
}


def weekly_schedules(timezone: str) -> list[Schedule]:
    return [Cron(cron, timezone=timezone, slug=slug) for slug, cron in WEEKLY_SLOTS]


def schedules_of(spec: DeploymentSpec, timezone: str) -> list[Schedule]:
    if spec.schedule == "weekly":
        return weekly_schedules(timezone)
    if spec.schedule == "sweep":
        return [Interval(SWEEP_EVERY_S, slug=SWEEP_SLUG)]
    return []


def all_deployments(
    timezone: str, pipeline: str = "weekly", playlist: str = DEFAULT_PLAYLIST
) -> list[RunnerDeployment]:
    deployments = []
    for spec in deployment_specs(pipeline, playlist):
        deployment = FLOWS[spec.flow_name].to_deployment(
            name=spec.name,
            schedules=schedules_of(spec, timezone),
            description=spec.description,
            parameters=spec.parameters,
            tags=spec.tags(pipeline),
            version=project_version(),
        )
        assert isinstance(deployment, RunnerDeployment)  # sync context: not a coroutine
        deployments.append(deployment)
    return deployments


def serve_all(pipeline: str | None = None, playlist: str = DEFAULT_PLAYLIST) -> None:
    """Setup, then serve until interrupted. Refuses (`InvalidInput`) a playlist that is not
    a file from here: every weekly run would fail on it."""
    from pathlib import Path

    from episodic.core.errors import InvalidInput

    if not Path(playlist).is_file():
        raise InvalidInput(
            f"playlist {playlist} not found from {Path.cwd()}: run `episodic serve` in the "
            "project folder or pass --playlist"
        )
    setup = prefect_setup(pipeline, mode="serve")
    for warning in setup["warnings"]:  # e.g. a `prefect deploy` copy of the weekly flow
        print(f"episodic: warning: {warning}", file=sys.stderr, flush=True)
    serve(*all_deployments(setup["timezone"], setup["pipeline"], playlist))


if __name__ == "__main__":
    serve_all()
