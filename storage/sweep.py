"""The stale sweep: the safety net for whatever the choke point let through.

Buckets, each a guarded bulk move along an allowed transition:

- ``expired_runs``: ``running`` runs whose lease expired (no process renews it; rows without
  a lease are judged by ``COALESCE(heartbeat_at, started_at, created_at)``) → ``failed``,
  resumable, with the reason recorded;
- ``expired_items``: ``running`` items whose claim lease expired → ``failed`` (claim
  cleared; an open submission stays as it is: an accepted job keeps its reference and a
  resume collects it, an intent is reconciled, never resubmitted);
- ``stale_pending_runs``: ``pending`` runs older than the pending TTL (never started) →
  ``cancelled``;
- ``orphaned_items``: ``pending`` items of cancelled runs that no active run includes →
  ``cancelled``.

Every ``UPDATE`` repeats its selection condition, so two sweeps at once (or a sweep racing a
worker that just renewed its lease) never move a row twice or move a live one: each reports
only the rows its own statement moved (``RETURNING``). Completed work is never touched.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Table,
    and_,
    select,
)

from episodic.core.states import ItemState, RunState
from episodic.storage import locks, predicates, statements, tx
from episodic.storage.admission import DedupPolicy
from episodic.storage.base import utcnow
from episodic.storage.models import ItemRow, RunItemRow, RunRow
from episodic.storage.runs import cancel_orphaned_items, lock_membership_of_runs
from episodic.storage.tx import retry_outages

_runs: Table = RunRow.__table__  # type: ignore[assignment]
_items: Table = ItemRow.__table__  # type: ignore[assignment]
_members: Table = RunItemRow.__table__  # type: ignore[assignment]

BUCKETS = ("expired_runs", "expired_items", "stale_pending_runs", "orphaned_items")
_CHUNK = 500


@dataclass(frozen=True, slots=True)
class SweepReport:
    """Per bucket, the ids moved (or, in a dry run, that would be moved)."""

    dry_run: bool
    at: datetime
    moved: dict[str, list[Any]] = field(default_factory=dict)

    def count(self, bucket: str) -> int:
        return len(self.moved.get(bucket, []))

    @property
    def total(self) -> int:
        return sum(len(v) for v in self.moved.values())


def _stale_pending(now: datetime, policy: DedupPolicy) -> ColumnElement[bool]:
    return and_(
        _runs.c.state == RunState.PENDING, predicates.pending_expired(now, policy.pending_ttl_s)
    )


def _orphans(conn: Connection, episode_pks: list[int] | None = None) -> list[tuple[int, int]]:
    """(item pk, episode pk) of the pending items of cancelled runs that no live run
    includes (of these episodes), by item pk."""
    cancelled = (
        select(_members.c.item_pk)
        .join(_runs, _runs.c.id == _members.c.run_id)
        .where(_runs.c.state == RunState.CANCELLED)
    )
    query = select(_items.c.id, _items.c.episode_pk).where(predicates.orphaned_pending(cancelled))
    if episode_pks is not None:
        query = query.where(_items.c.episode_pk.in_(episode_pks))
    return [(int(pk), int(ep)) for pk, ep in conn.execute(query.order_by(_items.c.id))]


def _orphans_locked(conn: Connection) -> list[int]:
    """The orphans' pks, read again under their episodes' membership locks: a run created
    meanwhile with one of them (committed, or committing while we wait) keeps it."""
    candidates = _orphans(conn)
    if candidates and conn.dialect.name == "postgresql":
        episodes = sorted({episode for _, episode in candidates})
        locks.lock_membership(conn, episodes)
        candidates = _orphans(conn, episodes)
    return [pk for pk, _ in candidates]


@retry_outages
class Sweeper:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def sweep(self, policy: DedupPolicy, *, dry_run: bool = False) -> SweepReport:
        """Run every bucket once; returns what each moved. Safe to run concurrently."""
        now = utcnow()
        report = SweepReport(dry_run, now, {bucket: [] for bucket in BUCKETS})
        expired = predicates.expired_run(now, policy.fallback_lease_s)
        self._bucket(
            report,
            "expired_runs",
            select(_runs.c.id).where(expired).order_by(_runs.c.created_at),
            lambda ids: statements.fail_expired_runs(ids, expired, now),
            dry_run,
            before=lock_membership_of_runs,  # before the runs' rows: locks.lock_membership
            after=lambda conn, ids: cancel_orphaned_items(conn, ids, now),
        )
        item_expired = predicates.lease_expired(now)
        self._bucket(
            report,
            "expired_items",
            select(_items.c.id).where(item_expired).order_by(_items.c.id),
            lambda ids: statements.fail_expired_items(ids, item_expired, now),
            dry_run,
        )
        stale = _stale_pending(now, policy)
        self._bucket(
            report,
            "stale_pending_runs",
            select(_runs.c.id).where(stale).order_by(_runs.c.created_at),
            lambda ids: statements.cancel_stale_pending(ids, stale, now, policy.pending_ttl_s),
            dry_run,
        )
        with tx.write(self.engine) if not dry_run else tx.read(self.engine) as conn:
            orphans = [pk for pk, _ in _orphans(conn)] if dry_run else _orphans_locked(conn)
            if not dry_run and orphans:
                orphans = [
                    int(pk)
                    for chunk in _chunks(orphans)
                    for pk in conn.execute(
                        statements.cancel_orphaned(
                            and_(_items.c.id.in_(chunk), _items.c.state == ItemState.PENDING), now
                        ).returning(_items.c.id)
                    ).scalars()
                ]
        report.moved["orphaned_items"] = orphans
        return report

    def _bucket(
        self,
        report: SweepReport,
        bucket: str,
        candidates: Any,
        move: Callable[[Sequence[Any]], Any],
        dry_run: bool,
        before: Callable[[Connection, Sequence[Any]], object] | None = None,
        after: Callable[[Connection, Sequence[Any]], object] | None = None,
    ) -> None:
        """Select candidates, then move them in chunks with a guarded, RETURNING update;
        `before` runs first in each chunk's transaction on the chunk's candidates, `after`
        last on the ids that chunk really moved."""
        with tx.read(self.engine) as conn:
            ids = [row[0] for row in conn.execute(candidates)]
        if dry_run or not ids:
            report.moved[bucket] = ids
            return
        moved: list[Any] = []
        for chunk in _chunks(ids):
            with tx.write(self.engine) as conn:
                if before is not None:
                    before(conn, chunk)
                done = list(conn.execute(move(chunk)).scalars())
                if after is not None and done:
                    after(conn, done)
            moved.extend(done)
        report.moved[bucket] = moved


def _chunks(values: Sequence[Any]) -> list[Sequence[Any]]:
    return [values[i : i + _CHUNK] for i in range(0, len(values), _CHUNK)]
