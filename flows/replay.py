"""Replay a pipeline's scheduled slot: its weekly chain, with the identity its scheduled run
has (`episodic.core.keys.slot_key`), so a repeat, or a replay of a slot the scheduler already ran,
returns the same episode and pays nothing twice.

Prefect has no start-now for a Scheduled run, and its Quick run, Copy to new run and
`prefect deployment run` make manual runs (`flow-run:{id}`), each a new episode. Two ways:

- `replay_here`: the weekly flow in this process (the chain up to the approval: a local
  run cannot suspend for the form; approve with `episodic approve` afterwards);
- `replay_on_deployment`: a flow run of the weekly deployment with the slot's key as its
  ``allocation_key`` parameter (what `prefect deployment run weekly-episode/weekly -p
  allocation_key=slot:…` does), run by the workers and waiting for its form as the
  scheduled run would.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prefect.client.orchestration import get_client
from prefect.exceptions import ObjectNotFound

from episodic.core.errors import InvalidInput
from episodic.core.keys import slot_key
from episodic.core.settings import Settings
from episodic.flows.weekly import FLOW_NAME, weekly_episode
from episodic.pipeline.gate import open_gate
from episodic.storage.registry import engine_for


@dataclass(frozen=True, slots=True)
class Replayed:
    pipeline: str
    slot: str  # the moment as given
    allocation_key: str
    episode_id: str | None  # None: the flow run was handed to the workers
    state: str | None
    flow_run_id: str | None = None
    flow_run_name: str | None = None
    deployment: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline,
            "slot": self.slot,
            "allocation_key": self.allocation_key,
            "episode_id": self.episode_id,
            "state": self.state,
            "flow_run_id": self.flow_run_id,
            "flow_run_name": self.flow_run_name,
            "deployment": self.deployment,
        }


def replay_here(
    settings: Settings,
    pipeline: str,
    moment: datetime,
    playlist: Path | None,
    *,
    generate: bool = True,
) -> Replayed:
    """The slot's weekly chain in this process: allocate (the slot's episode), plan from
    ``playlist`` unless a plan is recorded, generate (what is done is not paid again)."""
    key = slot_key(pipeline, moment)
    returned: Any = weekly_episode(
        allocation_key=key,
        pipeline=pipeline,
        playlist=None if playlist is None else str(playlist.absolute()),
        generate=generate,
        wait_for_approval=False,
    )
    episode_id = str(returned)
    episode = open_gate(engine_for(settings), pipeline, episode_id, "replay").episode
    return Replayed(pipeline, moment.isoformat(), key, episode_id, episode.state)


def _check_weekly(deployment: str) -> None:
    if deployment.count("/") != 1 or not deployment.startswith(f"{FLOW_NAME}/"):
        raise InvalidInput(
            f"--deployment {deployment!r}: name a deployment of the weekly flow, e.g. "
            f"{FLOW_NAME}/weekly"
        )


def deployment_crons(deployment: str) -> list[tuple[str, str]]:
    """The (cron expression, timezone) of each active cron schedule of ``deployment``;
    `InvalidInput` if the server has no such deployment."""
    from prefect.client.schemas.schedules import CronSchedule

    _check_weekly(deployment)
    with get_client(sync_client=True) as client:
        try:
            found = client.read_deployment_by_name(deployment)
        except ObjectNotFound:
            raise InvalidInput(f"no deployment {deployment} on the Prefect server") from None
    return [
        (s.schedule.cron, s.schedule.timezone or "UTC")
        for s in found.schedules or []
        if s.active and isinstance(s.schedule, CronSchedule)
    ]


def replay_on_deployment(pipeline: str, moment: datetime, deployment: str) -> Replayed:
    """A flow run of ``deployment`` (``flow/name``, a deployment of the weekly flow for
    ``pipeline``) with the slot's allocation key; its other parameters are the deployment's."""
    _check_weekly(deployment)
    key = slot_key(pipeline, moment)
    with get_client(sync_client=True) as client:
        try:
            found = client.read_deployment_by_name(deployment)
        except ObjectNotFound:
            raise InvalidInput(f"no deployment {deployment} on the Prefect server") from None
        fed = (found.parameters or {}).get("pipeline")
        if fed is not None and fed != pipeline:
            raise InvalidInput(
                f"deployment {deployment} runs pipeline {fed}, not {pipeline}: pass --pipeline "
                f"{fed} or another deployment"
            )
        run = client.create_flow_run_from_deployment(
            found.id,
            parameters={"allocation_key": key},
            tags=["episodic-replay"],
            # the name the weekly flow gives a replay until its episode is allocated
            name=f"{pipeline} slot {moment.astimezone(UTC):%Y-%m-%d %H:%M} UTC (replay)",
        )
    return Replayed(
        pipeline,
        moment.isoformat(),
        key,
        None,
        run.state.name if run.state else None,
        flow_run_id=str(run.id),
        flow_run_name=run.name,
        deployment=deployment,
    )
