"""The project's deployments, described once.

`episodic serve` builds its deployments from this; `prefect.yaml` (the `prefect deploy`
path) says the same in YAML, and a test keeps the two equal: names, entrypoints, parameters,
tags, schedules and their slugs.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from functools import cache
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from pathlib import Path
from typing import Any

WEEKLY_SLOTS = (  # (slug, cron) in the pipeline's recorded timezone
    ("weekly-monday-0900", "0 9 * * 1"),
    ("weekly-thursday-0900", "0 9 * * 4"),
)
SWEEP_EVERY_S = 300
SWEEP_SLUG = "sweep-every-5-min"
DEFAULT_PIPELINE = "weekly"
DEFAULT_PLAYLIST = "examples/playlist.yaml"  # relative: resolved in the project folder
WORK_POOL = "episodic"
TAG = "episodic"


@dataclass(frozen=True)
class DeploymentSpec:
    name: str
    flow_name: str
    entrypoint: str  # a module path: works wherever the package is installed
    description: str
    parameters: dict[str, Any] = field(default_factory=dict)
    schedule: str | None = None  # "weekly" | "sweep"

    @property
    def full_name(self) -> str:
        return f"{self.flow_name}/{self.name}"

    def tags(self, pipeline: str) -> list[str]:
        return [TAG, pipeline_tag(pipeline)]


def pipeline_tag(pipeline: str) -> str:
    """The tag every deployment of `pipeline` carries, so every run of it carries it from
    creation: ``pipeline:weekly`` (what the notification automations match on)."""
    return f"pipeline:{pipeline}"


def deployment_specs(
    pipeline: str = DEFAULT_PIPELINE, playlist: str = DEFAULT_PLAYLIST
) -> list[DeploymentSpec]:
    return [
        DeploymentSpec(
            "weekly",
            "weekly-episode",
            "episodic.flows.weekly:weekly_episode",
            "Twice a week (Mon + Thu 09:00 in the pipeline's timezone): allocate the slot's "
            "episode, plan it from the playlist, generate its images (paid, never twice), "
            "wait for a person's approval, assemble.",
            {"pipeline": pipeline, "playlist": playlist},
            schedule="weekly",
        ),
        DeploymentSpec(
            "plan",
            "plan-episode",
            "episodic.flows.plan:plan_episode_flow",
            "Record a playlist as an existing episode's plan (spends nothing).",
            {"pipeline": pipeline},
        ),
        DeploymentSpec(
            "generate",
            "generate-episode",
            "episodic.flows.generate:generate_episode",
            "Generate a planned episode's images (episode_id required); finished images are "
            "never paid again, and a run started twice joins the first.",
            {"pipeline": pipeline},
        ),
        DeploymentSpec(
            "approve",
            "approve-episode",
            "episodic.flows.review:approve_episode",
            "Wait for a person's decision on a generated episode: the form shows its images.",
            {"pipeline": pipeline},
        ),
        DeploymentSpec(
            "assemble",
            "assemble-episode",
            "episodic.flows.review:assemble_episode",
            "Assemble an approved episode from exactly the approved images (reruns change "
            "nothing).",
            {"pipeline": pipeline},
        ),
        DeploymentSpec(
            "sweep",
            "sweep",
            "episodic.flows.maintenance:cancel_stale",
            "Every 5 minutes: expired leases → failed (resumable), never-started runs and "
            "stuck flow runs → cancelled.",
            schedule="sweep",
        ),
    ]


def weekly_spec() -> DeploymentSpec:
    """The scheduled entry (`weekly-episode/weekly`)."""
    (weekly,) = (spec for spec in deployment_specs() if spec.schedule == "weekly")
    return weekly


@cache
def project_version() -> str:
    """`0.1.0` plus the git commit when the code runs from a checkout (`0.1.0+g1a2b3c4`)."""
    try:
        base = package_version("episodic")
    except PackageNotFoundError:
        base = "0+unknown"
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short=8", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return base
    return f"{base}+g{commit}" if commit else base
