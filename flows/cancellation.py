"""A Prefect cancel settles money: the jobs a cancelled flow run bought are cancelled at the
provider where its API allows.

How Prefect 3.9.1 delivers a cancel (read in its source: `runner/_cancellation_manager.py`,
`flow_engine.py`, `runner/_workspace_hook_runner.py`): the UI's Cancel sets the flow run
Cancelling; the worker that started it tells the flow-run process over its control channel
that a cancel is coming and sends it SIGTERM (SIGKILL after 30 s). In that process the
signal is raised as `TerminationSignal` in the flow's thread; the generate flow's engine
pauses its run, and this module's `settle_in_flow` then settles it before the process ends.
After the process is gone the worker runs the flow's `on_cancellation` hooks (a process
worker runs them in a hook subprocess with the flow run's environment) and proposes
Cancelled: `settle_hook` settles again whatever the process could not (it was killed, the
provider did not answer). An in-process generate subflow of a cancelled weekly run is
finalized by its own engine, which runs its `on_cancellation` hook in the flow-run process.

Both settle with `episodic.pipeline.cancel.settle_cancelled` (the runs the flow run worked on, found
by the links `link_flow_run` records: `pipeline.flow_links`), which asks the provider once per
job that still runs, keeps a job another live run collects, records each answer; the run's
log says what was cancelled, what still bills and the one command that settles it, and the
episode's `-cost` card on the run counts accepted jobs as committed spend.

A SIGTERM that is not a cancel (a worker shutting down, infrastructure stopping) settles
nothing: the paused run's accepted jobs keep running, and a later run collects them.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.context import FlowRunContext
from prefect.logging.loggers import flow_run_logger
from sqlalchemy import Engine

from episodic.core.settings import Settings, load_settings
from episodic.flows.artifacts import publish_spend
from episodic.flows.maintenance import stdlib_utc
from episodic.pipeline.cancel import Settlement, settle_cancelled
from episodic.pipeline.flow_links import (
    LINK_MARGIN,
    flow_run_chains,
    link_flow_runs,
    runs_linked_to,
)
from episodic.storage.registry import engine_for
from episodic.tasks.credentials import PrefectSecretCredentials

_CHAIN_MAX = 8  # flow runs above this one: a subflow's parents, and theirs
_SHARED_LOOKBACK = timedelta(days=7)  # links of other flow runs of a run: as old as a run lives


def flow_run_chain() -> list[str]:
    """The current flow run's id, then its parents' (a subflow runs inside its parent's
    process: cancelling the parent cancels it)."""
    context = FlowRunContext.get()
    if context is None or context.flow_run is None:
        return []
    chain = [str(context.flow_run.id)]
    parent_task = context.flow_run.parent_task_run_id
    with get_client(sync_client=True) as client:
        while parent_task is not None and len(chain) < _CHAIN_MAX:
            task_run = client.read_task_run(parent_task)
            if task_run.flow_run_id is None:
                break
            chain.append(str(task_run.flow_run_id))
            parent_task = client.read_flow_run(task_run.flow_run_id).parent_task_run_id
    return chain


def link_flow_run(engine: Engine, run_id: str) -> list[str]:
    """Record that the current flow run (and its parents) works on `run_id`; returns the
    chain of flow run ids. Never fails the run (a missing link only means a cancel hook
    or the sweep cannot find the run: the flow's own SIGTERM path still settles)."""
    try:
        chain = flow_run_chain()
        if chain:
            link_flow_runs(engine, run_id, chain)
        return chain
    except Exception as exc:
        logging.getLogger(__name__).warning("run %s: flow run not linked: %s", run_id, exc)
        return []


def cancel_requested(chain: list[str]) -> bool:
    """Whether this flow run or a parent is being cancelled (Cancelling, or already
    Cancelled): the SIGTERM this process got is a cancel, not a shutdown."""
    with get_client(sync_client=True) as client:
        for flow_run_id in chain:
            state = client.read_flow_run(UUID(flow_run_id)).state
            if state is not None and (state.is_cancelling() or state.is_cancelled()):
                return True
    return False


def shared_with_live(
    engine: Engine, run_ids: list[str], chain: list[str], since: datetime
) -> dict[str, list[str]]:
    """For each of `run_ids`, the other flow runs that also work on it and are still live in
    Prefect (not final, not being cancelled): two generate runs of one episode join one
    run (dedup), and cancelling one of them must not cancel the jobs the other collects.
    A flow run linked inside `chain` (the cancelled one, its parents, or a subflow of it)
    is the cancelled one's own, whatever state it was left in."""
    mine = set(chain)
    shared: dict[str, list[str]] = {}
    with get_client(sync_client=True) as client:
        for run_id, chains in flow_run_chains(engine, run_ids, since).items():
            for worker in dict.fromkeys(c[0] for c in chains if not mine & set(c)):
                try:
                    state = client.read_flow_run(UUID(worker)).state
                except Exception:  # deleted, or not a flow run of this server
                    continue
                if state is None or state.is_final() or state.is_cancelling():
                    continue
                if state.is_running() or state.is_pending() or state.is_paused():
                    shared.setdefault(run_id, []).append(worker)
    return shared


def _settle(
    engine: Engine,
    settings: Settings,
    run_ids: list[str],
    chain: list[str],
    since: datetime,
    logger: Any,
) -> Settlement | None:
    """Settle the runs no other live flow run works on; log the ones left to that run."""
    shared = shared_with_live(engine, run_ids, chain, since)
    for run_id, flow_runs in shared.items():
        logger.info(
            f"run {run_id} is also worked on by flow run {', '.join(flow_runs)}, still "
            "running: its jobs are left for it to collect (nothing cancelled at the "
            "provider); cancel that flow run too to stop them"
        )
    alone = [run_id for run_id in run_ids if run_id not in shared]
    if not alone:
        return None
    return settle_cancelled(engine, settings, alone, PrefectSecretCredentials())


def settle_in_flow(engine: Engine, settings: Settings, run_id: str, chain: list[str]) -> None:
    """The flow's own SIGTERM path: when the signal is a cancel, settle its run now (the
    process has about 30 s before the worker's SIGKILL) and say so in the run's log."""
    logger: Any = _run_logger()
    try:
        if not cancel_requested(chain):
            return
        since = datetime.now(UTC) - _SHARED_LOOKBACK
        settlement = _settle(engine, settings, [run_id], chain, since, logger)
        if settlement is None:
            return
    except Exception as exc:
        logger.warning(_unsettled(exc, [run_id]))
        return
    _say(logger, settlement)


def settle_hook(flow: Any, flow_run: Any, state: Any) -> None:
    """`on_cancellation` hook of the weekly and generate flows: settle the runs the
    cancelled flow run worked on, log what was cancelled and what still bills, and publish
    the episode's cost card on the flow run. Runs where Prefect runs it (the worker's hook
    subprocess, or the flow-run process for an in-process subflow); never raises."""
    logger: Any = flow_run_logger(flow_run, flow)
    run_ids: list[str] = []
    try:
        settings = load_settings()
        engine = engine_for(settings)
        since = stdlib_utc(flow_run.created) - LINK_MARGIN
        linked = runs_linked_to(engine, str(flow_run.id), since)
        run_ids = [run_id for run_id, _, _ in linked]
        if not linked:
            logger.info("cancelled before it started a paid run: nothing to settle at the provider")
            return
        settlement = _settle(
            engine,
            settings,
            run_ids,
            [str(flow_run.id)],
            datetime.now(UTC) - _SHARED_LOOKBACK,
            logger,
        )
        if settlement is None:
            return
        _say(logger, settlement)
        for pipeline, episode_id in dict.fromkeys((p, e) for _, p, e in linked):
            publish_spend(engine, pipeline, episode_id, flow_run_id=flow_run.id)
    except Exception as exc:
        logger.warning(_unsettled(exc, run_ids))


def _say(logger: Any, settlement: Settlement) -> None:
    for line in settlement.lines():
        if line.startswith("still billing:") and settlement.billing:
            logger.warning(line)
        else:
            logger.info(line)


def _unsettled(exc: BaseException, run_ids: list[str]) -> str:
    first = str(exc).splitlines()[0] if str(exc).strip() else type(exc).__name__
    command = f"episodic runs cancel {run_ids[0]}" if run_ids else "episodic runs list"
    return (
        f"the cancel could not settle the provider's jobs ({first[:200]}); they may still "
        f"be running and billing: settle with {command}"
    )


def _run_logger() -> Any:
    from prefect.exceptions import MissingContextError
    from prefect.logging import get_run_logger

    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger(__name__)
