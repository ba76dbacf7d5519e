"""`cancel_stale` (flow `sweep`): the scheduled sweep, and its Prefect buckets.

The database buckets are `episodic.pipeline.sweep`; this adds the ones only Prefect can see:

- ``stuck_flow_runs``: flow runs of this project's deployments stuck in Scheduled
  (including Late) or Pending for longer than the pending TTL (no worker took them),
  cancelled through the Prefect API;
- ``crashed_flow_runs``: this project's flow runs left Running by a dead process (after
  ``kill -9`` the worker marks the top-level run Crashed, but an in-process generate
  subflow and the item task runs stay Running for good), finalized as Crashed. A flow run
  is dead when a run of the ledger it worked on (`pipeline.flow_links`) lost its lease and no
  process holds any of them; its message says what was left at the provider and the command
  that finishes it. Then every task run still Running inside a flow run that ended
  (Crashed, Cancelled, Failed) is Crashed too: a task run never outlives its flow run.

A proposal the server rejects (the run moved meanwhile, another sweep was first) is not
counted.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from prefect import flow
from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.filters import (
    FlowFilter,
    FlowFilterName,
    FlowRunFilter,
    FlowRunFilterDeploymentId,
    FlowRunFilterExpectedStartTime,
    FlowRunFilterId,
    FlowRunFilterState,
    FlowRunFilterStateType,
    TaskRunFilter,
    TaskRunFilterState,
    TaskRunFilterStateType,
)
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.client.schemas.responses import SetStateStatus
from prefect.client.schemas.sorting import FlowRunSort
from prefect.logging import get_run_logger
from prefect.states import Cancelled, Crashed
from sqlalchemy import Engine

from episodic.core.settings import load_settings
from episodic.flows.params import Flag
from episodic.pipeline.admission import dedup_policy
from episodic.pipeline.flow_links import crashed_messages, orphan_message, orphan_messages
from episodic.pipeline.sweep import BUCKET_MEANING, sweep
from episodic.storage.registry import engine_for

PROJECT_FLOWS = (
    "weekly-episode",
    "plan-episode",
    "generate-episode",
    "approve-episode",
    "assemble-episode",
    "sweep",
    "cancel-stale",  # the sweep's flow name before 0.1 deployments were renamed
)
PREFECT_BUCKET = "stuck_flow_runs"
PREFECT_MEANING = "Scheduled/Late/Pending → Cancelled: no worker started them within the TTL"
GHOST_BUCKET = "crashed_flow_runs"
GHOST_MEANING = (
    "Running → Crashed: flow runs (lease expired) and task runs left Running by a dead process"
)
_ENDED = [StateType.CRASHED, StateType.CANCELLED, StateType.FAILED]
_PAGE = 200


def cancel_stuck_flow_runs(ttl_s: float, *, dry_run: bool = False) -> list[str]:
    """Cancel (or, dry run, list) this project's deployment flow runs that have waited in
    Scheduled/Late/Pending for more than `ttl_s` seconds past their expected start.
    Returns the flow run ids this call cancelled (or would cancel)."""
    cutoff = datetime.now(UTC) - timedelta(seconds=ttl_s)
    stuck = FlowRunFilter(
        state=FlowRunFilterState(
            type=FlowRunFilterStateType(any_=[StateType.SCHEDULED, StateType.PENDING])
        ),
        expected_start_time=FlowRunFilterExpectedStartTime(before_=cutoff),
        deployment_id=FlowRunFilterDeploymentId(is_null_=False),
    )
    ours = FlowFilter(name=FlowFilterName(any_=list(PROJECT_FLOWS)))
    done: list[str] = []
    message = f"cancelled by the episodic sweep: not started within {ttl_s:g} s"
    with get_client(sync_client=True) as client:
        offset = 0  # rows that still match after this pass (rejected proposals, dry run)
        while True:
            page = client.read_flow_runs(
                flow_filter=ours,
                flow_run_filter=stuck,
                sort=FlowRunSort.EXPECTED_START_TIME_ASC,
                limit=_PAGE,
                offset=offset,
            )
            for run in page:
                cancelled = dry_run or _cancel(client, run.id, message)
                if cancelled:
                    done.append(str(run.id))
                else:
                    offset += 1
            if dry_run:
                offset += len(page)
            if len(page) < _PAGE:
                break
    return done


def crash_ghost_runs(
    engine: Engine, fallback_lease_s: float, *, dry_run: bool = False
) -> list[str]:
    """Finalize (or, dry run, list) this project's flow runs left Running by a dead process
    as Crashed, then the task runs left Running in ended flow runs. Returns
    ``flow-run:{id}`` and ``task-run:{id}`` entries for what this call moved."""
    ours = FlowFilter(name=FlowFilterName(any_=list(PROJECT_FLOWS)))
    done: list[str] = []
    with get_client(sync_client=True) as client:
        running = _all(
            lambda offset: client.read_flow_runs(
                flow_filter=ours,
                flow_run_filter=FlowRunFilter(
                    state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.RUNNING]))
                ),
                sort=FlowRunSort.EXPECTED_START_TIME_ASC,
                limit=_PAGE,
                offset=offset,
            )
        )
        crashed = crashed_messages(engine, fallback_lease_s, _started(running))
        for run in running:
            message = crashed.get(str(run.id))
            if message is None:
                continue
            if dry_run or _propose(client, run.id, Crashed(message=message)):
                done.append(f"flow-run:{run.id}")
        orphans = _all(
            lambda offset: client.read_task_runs(
                flow_filter=ours,
                flow_run_filter=FlowRunFilter(
                    state=FlowRunFilterState(type=FlowRunFilterStateType(any_=_ENDED))
                ),
                task_run_filter=TaskRunFilter(
                    state=TaskRunFilterState(type=TaskRunFilterStateType(any_=[StateType.RUNNING]))
                ),
                limit=_PAGE,
                offset=offset,
            )
        )
        parents = {str(t.flow_run_id) for t in orphans if t.flow_run_id is not None}
        ended = {str(r.id): r for r in _read_flow_runs(client, parents)}
        owned = orphan_messages(engine, fallback_lease_s, _started(list(ended.values())))
        for task_run in orphans:
            message = owned.get(str(task_run.flow_run_id)) or orphan_message([])
            if dry_run or _propose_task(client, task_run.id, Crashed(message=message)):
                done.append(f"task-run:{task_run.id}")
    return done


def _started(runs: list[FlowRun]) -> dict[str, datetime]:
    """Flow run id -> when it started (its creation when it never did)."""
    return {str(r.id): stdlib_utc(r.start_time or r.created) for r in runs}


def stdlib_utc(moment: datetime | None) -> datetime:
    """A Prefect timestamp (a pendulum DateTime in 3.9.1, whose Pendulum-only behaviour is
    deprecated) as a plain aware datetime in UTC; now when it is missing."""
    if moment is None:
        return datetime.now(UTC)
    return datetime.fromtimestamp(moment.timestamp(), UTC)


def _all(page: Callable[[int], list[Any]]) -> list[Any]:
    found: list[Any] = []
    while True:
        batch = page(len(found))
        found.extend(batch)
        if len(batch) < _PAGE:
            return found


def _read_flow_runs(client: SyncPrefectClient, ids: set[str]) -> list[FlowRun]:
    if not ids:
        return []
    return list(
        client.read_flow_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[UUID(i) for i in ids])),
            limit=len(ids),
        )
    )


def _propose(client: SyncPrefectClient, flow_run_id: UUID, state: Any) -> bool:
    result: Any = client.set_flow_run_state(flow_run_id, state)
    return bool(result.status == SetStateStatus.ACCEPT)


def _propose_task(client: SyncPrefectClient, task_run_id: UUID, state: Any) -> bool:
    result: Any = client.set_task_run_state(task_run_id, state)
    return bool(result.status == SetStateStatus.ACCEPT)


def _cancel(client: SyncPrefectClient, flow_run_id: UUID, message: str) -> bool:
    result: Any = client.set_flow_run_state(flow_run_id, Cancelled(message=message))
    return bool(result.status == SetStateStatus.ACCEPT)


@flow(name="sweep", validate_parameters=True, flow_run_name="sweep")
def cancel_stale(dry_run: Flag = False) -> dict[str, Any]:
    """The stale sweep: expired run and item leases → failed (resumable), never-started runs
    → cancelled, orphaned items of cancelled runs → cancelled, this project's flow runs
    stuck in Scheduled/Late/Pending past EPISODIC_PENDING_TTL_S → cancelled, and its flow
    runs and task runs left Running by a dead process → crashed."""
    logger = get_run_logger()
    settings = load_settings()
    report = sweep(engine_for(settings), settings, dry_run=dry_run)
    buckets: dict[str, list[Any]] = dict(report.moved)
    buckets[PREFECT_BUCKET] = cancel_stuck_flow_runs(settings.pending_ttl_s, dry_run=dry_run)
    buckets[GHOST_BUCKET] = crash_ghost_runs(
        engine_for(settings), dedup_policy(settings).fallback_lease_s, dry_run=dry_run
    )
    meaning = {**BUCKET_MEANING, PREFECT_BUCKET: PREFECT_MEANING, GHOST_BUCKET: GHOST_MEANING}
    for name, ids in buckets.items():
        logger.info(
            "%s %s: %d (%s)", "would move" if dry_run else "moved", name, len(ids), meaning[name]
        )
    return {
        "dry_run": dry_run,
        "buckets": {k: {"count": len(v), "ids": v} for k, v in buckets.items()},
    }
