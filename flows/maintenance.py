"""`cancel_stale` (flow `sweep`): the scheduled sweep (DESIGN 6), and its Prefect bucket.

The database buckets are `pipeline.sweep`; this adds the one only Prefect can see: flow runs
of this project's deployments stuck in Scheduled (including Late) or Pending for longer than
the pending TTL (no worker took them), cancelled through the Prefect API. A proposal the
server rejects (the run started meanwhile, another sweep cancelled it first) is not counted.
"""

from __future__ import annotations

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
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import StateType
from prefect.client.schemas.responses import SetStateStatus
from prefect.client.schemas.sorting import FlowRunSort
from prefect.logging import get_run_logger
from prefect.states import Cancelled

from core.settings import load_settings
from flows.params import Flag
from pipeline.sweep import BUCKET_MEANING, sweep
from storage.registry import engine_for

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


def _cancel(client: SyncPrefectClient, flow_run_id: UUID, message: str) -> bool:
    result: Any = client.set_flow_run_state(flow_run_id, Cancelled(message=message))
    return bool(result.status == SetStateStatus.ACCEPT)


@flow(name="sweep", validate_parameters=True, flow_run_name="sweep")
def cancel_stale(dry_run: Flag = False) -> dict[str, Any]:
    """The stale sweep: expired run and item leases → failed (resumable), never-started runs
    → cancelled, orphaned items of cancelled runs → cancelled, and this project's flow runs
    stuck in Scheduled/Late/Pending past EPISODIC_PENDING_TTL_S → cancelled."""
    logger = get_run_logger()
    settings = load_settings()
    report = sweep(engine_for(settings), settings, dry_run=dry_run)
    buckets: dict[str, list[Any]] = dict(report.moved)
    buckets[PREFECT_BUCKET] = cancel_stuck_flow_runs(settings.pending_ttl_s, dry_run=dry_run)
    meaning = {**BUCKET_MEANING, PREFECT_BUCKET: PREFECT_MEANING}
    for name, ids in buckets.items():
        logger.info(
            "%s %s: %d (%s)", "would move" if dry_run else "moved", name, len(ids), meaning[name]
        )
    return {
        "dry_run": dry_run,
        "buckets": {k: {"count": len(v), "ids": v} for k, v in buckets.items()},
    }
