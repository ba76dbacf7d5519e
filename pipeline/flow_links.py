"""The ledger's side of a Prefect flow run: which runs it worked on, and what a dead one left.

A flow run that starts a run records the link (`episodic.storage.flow_runs`); a cancelled flow run's
hook settles the runs linked to it (`flows.cancellation`), and the sweep finalizes a flow run
left Running by a dead process with a message that says what it left at the provider
(`flows.maintenance`). Nothing here knows Prefect: flow run ids are opaque strings and their
start times plain aware datetimes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from sqlalchemy import Engine

from episodic.storage.flow_runs import FlowRunLinks, RunLife, dead

LINK_MARGIN = timedelta(minutes=5)  # clock skew between Prefect's server and the database


def link_flow_runs(engine: Engine, run_id: str, chain: Sequence[str]) -> None:
    """Record that the flow runs of `chain` (the one working on `run_id` first, then those
    it runs inside) work on `run_id`."""
    FlowRunLinks(engine).record(run_id, chain)


def flow_run_chains(
    engine: Engine, run_ids: Iterable[str], since: datetime
) -> dict[str, list[list[str]]]:
    """For each run id, the chains of flow runs linked to it since `since` (each the flow
    run that worked on it, then those it ran inside); ids with no link left out."""
    return FlowRunLinks(engine).chains_of(run_ids, since)


def runs_linked_to(engine: Engine, flow_run_id: str, since: datetime) -> list[tuple[str, str, str]]:
    """The runs linked to `flow_run_id` since `since`, oldest link first, as (run id,
    pipeline, episode id)."""
    lives = FlowRunLinks(engine).runs_of([flow_run_id], since).get(flow_run_id, [])
    return [(life.run_id, life.pipeline, life.episode_id) for life in lives]


def crashed_messages(
    engine: Engine, fallback_lease_s: float, started: dict[str, datetime]
) -> dict[str, str]:
    """Of the flow runs left Running (`started`: flow run id -> when it started), those whose
    process is gone (`episodic.storage.flow_runs.dead`: a run it worked on lost its lease and no
    process holds any of them), each with its Crashed message."""
    lives = _lives(engine, fallback_lease_s, started)
    return {
        flow_run: ghost_message(lives[flow_run])
        for flow_run in started
        if dead(lives.get(flow_run, []))
    }


def orphan_messages(
    engine: Engine, fallback_lease_s: float, started: dict[str, datetime]
) -> dict[str, str]:
    """For each ended flow run (`started`: flow run id -> when it started), the Crashed
    message of a task run it left Running."""
    lives = _lives(engine, fallback_lease_s, started)
    return {flow_run: orphan_message(lives.get(flow_run, [])) for flow_run in started}


def ghost_message(lives: list[RunLife]) -> str:
    """A dead flow run's Crashed message: what it left at the provider, how to finish."""
    lost = next(life for life in lives if life.lost)
    expiry = f" at {lost.lease_expires_at:%Y-%m-%d %H:%M:%S} UTC" if lost.lease_expires_at else ""
    jobs = sum(life.accepted_jobs for life in lives)
    unfinished = sum(life.unfinished for life in lives)
    return (
        f"crashed: the process of this flow run stopped (run {lost.run_id} of episode "
        f"{lost.episode_id} lost its lease{expiry}; no process renews it); left at the "
        f"provider: {jobs} accepted jobs not collected yet (a resume collects them, never "
        f"buys them again), {unfinished} items unfinished; finish with: episodic runs resume "
        f"{lost.run_id} (or Retry the weekly run); finalized by the episodic sweep"
    )[:1900]


def orphan_message(lives: list[RunLife]) -> str:
    """The Crashed message of a task run left Running in a flow run that ended."""
    text = "crashed: its flow run ended while this task run was Running (its process stopped)"
    if lives:
        run = lives[-1]
        text += (
            f"; the item belongs to run {run.run_id} of episode {run.episode_id} "
            f"({run.accepted_jobs} accepted jobs at the provider); finish with: episodic runs "
            f"resume {run.run_id}"
        )
    return text + "; finalized by the episodic sweep"


def _lives(
    engine: Engine, fallback_lease_s: float, started: dict[str, datetime]
) -> dict[str, list[RunLife]]:
    if not started:
        return {}
    since = min(started.values()) - LINK_MARGIN
    return FlowRunLinks(engine, fallback_lease_s).runs_of(list(started), since)
