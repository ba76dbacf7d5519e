"""Which runs of the ledger a Prefect flow run worked on, and whether their process lives.

Prefect knows its flow runs; the ledger knows its runs, their leases and the jobs they left
at the provider. A flow run that starts a run records the link once, as an episode event
``prefect_flow_run`` (append-only history, no schema change): ``{run_id, flow_runs}``, the
flow run itself and the ones it runs inside (a generate subflow's weekly parent), as text.
Nothing here knows Prefect: ids are opaque strings.

Two readers:

- a cancelled flow run's hook finds the runs to settle (`FlowRunLinks.runs_of`);
- the sweep judges a flow run left Running (`RunLife.dead`): its process is gone when a run
  it worked on lost its lease (still ``running`` with the lease expired, or already reaped
  by the sweep as failed for that reason) and none of its runs is held by a live lease.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, Table, func, insert, select

from episodic.core.records import EventKind
from episodic.core.states import ItemState, RunState, SubmissionState
from episodic.storage import predicates, tx
from episodic.storage.base import utcnow
from episodic.storage.models import (
    EpisodeEventRow,
    EpisodeRow,
    ItemRow,
    RunItemRow,
    RunRow,
    SubmissionRow,
)

_events: Table = EpisodeEventRow.__table__  # type: ignore[assignment]
_episodes: Table = EpisodeRow.__table__  # type: ignore[assignment]
_runs: Table = RunRow.__table__  # type: ignore[assignment]
_items: Table = ItemRow.__table__  # type: ignore[assignment]
_members: Table = RunItemRow.__table__  # type: ignore[assignment]
_subs: Table = SubmissionRow.__table__  # type: ignore[assignment]

LEASE_EXPIRED = "lease expired"
"""How the sweep's reaped runs' error text begins (`storage.sweep`, bucket expired_runs)."""


@dataclass(frozen=True, slots=True)
class RunLife:
    """A run a flow run worked on, as the ledger has it now."""

    run_id: str
    pipeline: str
    episode_id: str
    state: str
    alive: bool  # running, and its lease is live: some process renews it
    lease_expires_at: datetime | None
    error_text: str | None
    accepted_jobs: int  # jobs the provider accepted for its items and nobody collected
    unfinished: int  # its items not completed (pending, running, failed)

    @property
    def lost(self) -> bool:
        """Its process stopped without concluding it: the lease expired while running."""
        return (not self.alive and self.state == RunState.RUNNING) or (
            self.state == RunState.FAILED and (self.error_text or "").startswith(LEASE_EXPIRED)
        )


def dead(lives: Sequence[RunLife]) -> bool:
    """A flow run whose runs are these left its process behind: one lost its lease and
    no process holds any of them."""
    return any(life.lost for life in lives) and not any(life.alive for life in lives)


@tx.retry_outages
class FlowRunLinks:
    def __init__(self, engine: Engine, fallback_lease_s: float = 60.0) -> None:
        self.engine = engine
        self.fallback_lease_s = fallback_lease_s

    def record(self, run_id: str, flow_run_ids: Sequence[str]) -> None:
        """Link `run_id` to the flow run working on it (first) and those it runs inside."""
        with tx.write(self.engine) as conn:
            episode_pk = conn.execute(
                select(_runs.c.episode_pk).where(_runs.c.id == run_id)
            ).scalar_one()
            conn.execute(
                insert(_events).values(
                    episode_pk=episode_pk,
                    kind=EventKind.FLOW_RUN_LINKED,
                    at=utcnow(),
                    detail={"run_id": run_id, "flow_runs": [str(f) for f in flow_run_ids]},
                )
            )

    def chains_of(self, run_ids: Iterable[str], since: datetime) -> dict[str, list[list[str]]]:
        """For each run id, the chains of flow runs linked to it since `since`: each the
        flow run that worked on it, then those it ran inside; ids with no link left out."""
        wanted = {str(r) for r in run_ids}
        found: dict[str, list[list[str]]] = {}
        with tx.read(self.engine) as conn:
            rows = conn.execute(
                select(_events.c.detail).where(
                    _events.c.kind == EventKind.FLOW_RUN_LINKED, _events.c.at >= since
                )
            ).scalars()
            for detail in rows:
                if isinstance(detail, dict) and str(detail.get("run_id")) in wanted:
                    chain = [str(f) for f in detail.get("flow_runs") or ()]
                    if chain:
                        found.setdefault(str(detail["run_id"]), []).append(chain)
        return found

    def runs_of(self, flow_run_ids: Iterable[str], since: datetime) -> dict[str, list[RunLife]]:
        """For each flow run id, the runs linked to it since `since` (a flow run's links are
        recorded after it started), oldest link first; ids with no link are left out."""
        wanted = {str(f) for f in flow_run_ids}
        linked: dict[str, list[str]] = {}
        with tx.read(self.engine) as conn:
            rows = conn.execute(
                select(_events.c.detail)
                .where(_events.c.kind == EventKind.FLOW_RUN_LINKED, _events.c.at >= since)
                .order_by(_events.c.id)
            ).scalars()
            for detail in rows:
                if not isinstance(detail, dict):
                    continue
                for flow_run_id in set(detail.get("flow_runs") or ()) & wanted:
                    runs = linked.setdefault(flow_run_id, [])
                    if detail.get("run_id") not in runs:
                        runs.append(str(detail.get("run_id")))
            lives = self._lives(conn, sorted({r for runs in linked.values() for r in runs}))
        return {f: [lives[r] for r in runs if r in lives] for f, runs in linked.items()}

    def _lives(self, conn: Any, run_ids: list[str]) -> dict[str, RunLife]:
        if not run_ids:
            return {}
        now = utcnow()
        alive = predicates.live_run(now, self.fallback_lease_s)
        accepted = _per_run(
            conn,
            select(_members.c.run_id, func.count(_subs.c.id))
            .join(_subs, _subs.c.item_pk == _members.c.item_pk)
            .where(
                _members.c.run_id.in_(run_ids),
                _subs.c.state == SubmissionState.ACCEPTED,
                _subs.c.remote_ref.is_not(None),
            ),
        )
        unfinished = _per_run(
            conn,
            select(_members.c.run_id, func.count())
            .join(_items, _items.c.id == _members.c.item_pk)
            .where(_members.c.run_id.in_(run_ids), _items.c.state != ItemState.COMPLETED),
        )
        rows = conn.execute(
            select(
                _runs.c.id,
                _episodes.c.pipeline,
                _episodes.c.episode_id,
                _runs.c.state,
                alive.label("alive"),
                _runs.c.lease_expires_at,
                _runs.c.error_text,
            )
            .join(_episodes, _episodes.c.id == _runs.c.episode_pk)
            .where(_runs.c.id.in_(run_ids))
        ).all()
        return {
            str(r.id): RunLife(
                str(r.id),
                str(r.pipeline),
                str(r.episode_id),
                str(r.state),
                bool(r.alive),
                r.lease_expires_at,
                r.error_text,
                accepted.get(str(r.id), 0),
                unfinished.get(str(r.id), 0),
            )
            for r in rows
        }


def _per_run(conn: Any, counted: Any) -> dict[str, int]:
    """(run id, count) rows of a query grouped here by run."""
    return {str(run): int(n) for run, n in conn.execute(counted.group_by(_members.c.run_id)).all()}
