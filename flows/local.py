"""Run deployment flow runs in this process, as a worker would, against the current API.

Used by the demo and the flow tests. The flow runs are real: created by the Prefect server's
own scheduling endpoint (so they are ``auto_scheduled`` with the slot as expected start time,
exactly as the scheduler service makes them), then executed in-process by Prefect's flow
engine (what ``prefect flow-run execute`` does). A "retry" puts the same flow run back into
``Scheduled`` and executes it again, as the UI's Retry button does.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from prefect import Flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
from prefect.client.schemas.objects import FlowRun, State
from prefect.client.schemas.sorting import FlowRunSort
from prefect.deployments.runner import RunnerDeployment
from prefect.exceptions import Pause
from prefect.flow_engine import run_flow
from prefect.schedules import Schedule
from prefect.states import Scheduled


def apply_deployment(
    flow: Flow[..., Any], name: str, schedule: Schedule, parameters: dict[str, Any] | None = None
) -> UUID:
    """Register (or update) a served-style deployment of ``flow`` with one schedule."""
    deployment = flow.to_deployment(name=name, schedules=[schedule], parameters=parameters or {})
    assert isinstance(deployment, RunnerDeployment)  # sync context: not a coroutine
    deployment_id = deployment.apply()
    assert isinstance(deployment_id, UUID)
    return deployment_id


def schedule_slots(deployment_id: UUID, start: datetime, end: datetime) -> list[FlowRun]:
    """Ask the server to create the deployment's scheduled runs between start and end."""
    with get_client(sync_client=True) as client:
        response = client.request(
            "POST",
            "/deployments/{id}/schedule",
            path_params={"id": deployment_id},
            json={"start_time": start.isoformat(), "end_time": end.isoformat(), "max_runs": 100},
        )
        response.raise_for_status()
        return deployment_flow_runs(deployment_id)


def deployment_flow_runs(deployment_id: UUID) -> list[FlowRun]:
    with get_client(sync_client=True) as client:
        return client.read_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])),
            sort=FlowRunSort.EXPECTED_START_TIME_ASC,
        )


def execute(flow: Flow[..., Any], flow_run_id: UUID) -> State[Any]:
    """Execute an existing flow run in this process, now, and return its final state.

    A slot scheduled for later (the demo runs this week's slots; on a Monday before 09:00 the
    Monday slot is still ahead) is moved to run now first, as the UI's "Run now" does:
    otherwise Prefect makes the run wait until its scheduled time. Its expected start time,
    the slot the episode is allocated for, does not change."""
    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(flow_run_id)
        current = flow_run.state
        later = current.state_details.scheduled_time if current is not None else None
        if current is not None and current.is_scheduled() and later and later > datetime.now(UTC):
            client.set_flow_run_state(flow_run_id, Scheduled(), force=True)
            flow_run = client.read_flow_run(flow_run_id)
    try:
        state = run_flow(flow, flow_run=flow_run, return_type="state")
    except Pause:  # suspended (waiting for input): the run's state says so
        with get_client(sync_client=True) as client:
            state = client.read_flow_run(flow_run_id).state
    assert isinstance(state, State)
    return state


def retry(flow: Flow[..., Any], flow_run_id: UUID) -> State[Any]:
    """Re-run a finished flow run in place (the UI's Retry): same flow run, same slot."""
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(flow_run_id, Scheduled(), force=True)
    return execute(flow, flow_run_id)
