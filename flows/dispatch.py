"""`episodic dispatch`: start a deployment's flow run once per request.

The door for automation (cron jobs, webhooks, a person clicking twice): a request is the
deployment plus its parameters, fingerprinted like a run request (`core.dedup`). Dispatchers
of one fingerprint are serialized through the project database (an advisory lock on
Postgres, the write lock on SQLite), and within that lock the Prefect API is asked for an
active flow run (Scheduled, Late, Pending, Running, Paused, Cancelling) of the same
fingerprint created within the dedup window: if there is one it is returned with
``deduplicated: true``. Otherwise the deployment is started with `run_deployment` and a
Prefect idempotency key derived from the fingerprint (and the number of earlier runs of it),
so even a dispatcher that bypassed the lock gets the same flow run back from the server.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.filters import (
    DeploymentFilter,
    DeploymentFilterId,
    FlowRunFilter,
    FlowRunFilterExpectedStartTime,
    FlowRunFilterState,
    FlowRunFilterStateType,
    FlowRunFilterTags,
)
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.client.schemas.sorting import FlowRunSort
from prefect.deployments import run_deployment
from prefect.exceptions import ObjectNotFound
from prefect.settings import get_current_settings
from sqlalchemy import Engine

from episodic.core.dedup import RunRequest, check_dedup_options, parse_idempotency_key
from episodic.core.errors import IdempotencyKeyReused, InvalidInput, ProviderConfigError
from episodic.core.settings import Settings
from episodic.pipeline.dispatch import one_dispatcher
from episodic.pipeline.gate import open_gate

# command → (flow name, deployment name): `episodic.deployments.spec` (serve and prefect.yaml).
DEPLOYMENTS = {
    "generate": ("generate-episode", "generate"),
    "approve": ("approve-episode", "approve"),
    "assemble": ("assemble-episode", "assemble"),
}
ACTIVE_TYPES = [
    StateType.SCHEDULED,
    StateType.PENDING,
    StateType.RUNNING,
    StateType.PAUSED,
    StateType.CANCELLING,
]


@dataclass(frozen=True, slots=True)
class Dispatched:
    flow_run_id: str
    flow_run_name: str
    deployment: str
    state: str
    deduplicated: bool
    prefect_idempotency_key: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "flow_run_id": self.flow_run_id,
            "flow_run_name": self.flow_run_name,
            "deployment": self.deployment,
            "state": self.state,
            "deduplicated": self.deduplicated,
            "prefect_idempotency_key": self.prefect_idempotency_key,
        }


def fingerprint_tag(fingerprint: str) -> str:
    return f"episodic-fp:{fingerprint[:32]}"


def request_tag(request_sha256: str) -> str:
    return f"episodic-req:{request_sha256[:32]}"


def dispatch(
    engine: Engine,
    settings: Settings,
    pipeline: str,
    command: str,
    episode_id: str,
    *,
    idempotency_key: str | None = None,
    allow_duplicate: bool = False,
) -> Dispatched:
    """Start `command`'s deployment for an existing episode, once per request.

    Errors: `InvalidInput` (unknown command, bad key, no Prefect API configured: exit 2),
    `EpisodeNotFound` (5), `ProviderConfigError` (deployment not registered: 2),
    `IdempotencyKeyReused` (2).
    """
    check_dedup_options(idempotency_key, None, allow_duplicate)
    if command not in DEPLOYMENTS:
        raise InvalidInput(f"unknown command {command!r}: use one of {', '.join(DEPLOYMENTS)}")
    if not get_current_settings().api.url:
        raise InvalidInput(
            "dispatch needs a Prefect server: set PREFECT_API_URL (e.g. http://127.0.0.1:4200/api)"
        )
    gate = open_gate(engine, pipeline, episode_id, f"dispatch-{command}")
    flow_name, deployment_name = DEPLOYMENTS[command]
    full_name = f"{flow_name}/{deployment_name}"
    parameters, request = _request(
        pipeline, command, gate.episode_id, full_name, idempotency_key, allow_duplicate
    )
    fp_tag = fingerprint_tag(request.fingerprint)
    req_tag = request_tag(request.request_sha256)
    since = datetime.now(UTC) - timedelta(seconds=settings.dedup_window_s)
    with one_dispatcher(engine, request.fingerprint):
        with get_client(sync_client=True) as client:
            found = _existing(client, full_name, request, fp_tag, req_tag, since, settings)
            if isinstance(found, FlowRun):
                return _answer(found, full_name, True, found.idempotency_key)
            earlier = found
        # Still inside the lock: the key names this request's next run.
        prefect_key = (
            f"episodic:{request.fingerprint}:{uuid.uuid4().hex}"
            if allow_duplicate
            else f"episodic:{request.fingerprint}:{earlier}"
        )
        flow_run = run_deployment(
            full_name,
            parameters=parameters,
            timeout=0,
            tags=[fp_tag, req_tag],
            flow_run_name=f"{command} {gate.episode_id}",
            idempotency_key=prefect_key,
            as_subflow=False,
        )
    assert isinstance(flow_run, FlowRun)  # sync context: not a coroutine
    return _answer(flow_run, full_name, False, prefect_key)


def _request(
    pipeline: str,
    command: str,
    episode_id: str,
    full_name: str,
    idempotency_key: str | None,
    allow_duplicate: bool,
) -> tuple[dict[str, Any], RunRequest]:
    """What a dispatch of `command` asks: the parameters of the deployment's flow run, and
    the request they make (its fingerprint says which dispatches are the same)."""
    parameters: dict[str, Any] = {"episode_id": episode_id, "pipeline": pipeline}
    if command == "generate" and idempotency_key is not None:
        parameters["idempotency_key"] = idempotency_key
    if command == "generate" and allow_duplicate:
        parameters["allow_duplicate"] = True
    request = RunRequest(
        pipeline=pipeline,
        episode_id=episode_id,
        command=f"dispatch:{command}",
        params={"deployment": full_name, "parameters": parameters},
        idempotency_key=parse_idempotency_key(idempotency_key),
        allow_duplicate=allow_duplicate,
    )
    return parameters, request


def _existing(
    client: SyncPrefectClient,
    full_name: str,
    request: RunRequest,
    fp_tag: str,
    req_tag: str,
    since: datetime,
    settings: Settings,
) -> FlowRun | int:
    """The active flow run of this request within the window, or the number of flow runs
    of it so far (the next one's ordinal). Raises `IdempotencyKeyReused`."""
    try:
        deployment = client.read_deployment_by_name(full_name)
    except ObjectNotFound:
        raise ProviderConfigError(
            f"deployment {full_name} is not registered: run `episodic serve` or "
            "`prefect deploy --all` in the project folder"
        ) from None
    of_deployment = DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id]))
    recent = FlowRunFilterExpectedStartTime(after_=since)
    if settings.dedup_window_s > 0:
        if request.idempotency_key is not None:
            for run in client.read_flow_runs(  # a key names one request, across deployments
                flow_run_filter=FlowRunFilter(
                    tags=FlowRunFilterTags(all_=[fp_tag]), expected_start_time=recent
                ),
                limit=50,
            ):
                if req_tag not in run.tags:
                    raise IdempotencyKeyReused(request.idempotency_key, f"(flow run) {run.id}")
        if not request.allow_duplicate:
            active = client.read_flow_runs(
                deployment_filter=of_deployment,
                flow_run_filter=FlowRunFilter(
                    tags=FlowRunFilterTags(all_=[fp_tag]),
                    expected_start_time=recent,
                    state=FlowRunFilterState(type=FlowRunFilterStateType(any_=ACTIVE_TYPES)),
                ),
                sort=FlowRunSort.EXPECTED_START_TIME_DESC,
                limit=1,
            )
            if active:
                return active[0]
    return client.count_flow_runs(
        deployment_filter=of_deployment,
        flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[fp_tag])),
    )


def _answer(run: FlowRun, deployment: str, deduplicated: bool, key: str | None) -> Dispatched:
    return Dispatched(
        flow_run_id=str(run.id),
        flow_run_name=run.name,
        deployment=deployment,
        state=(run.state.name if run.state else None) or "unknown",
        deduplicated=deduplicated,
        prefect_idempotency_key=key,
    )
