"""Runs and their members: the run lifecycle, and which items each run was asked to finish.

Every state change is one guarded statement (``UPDATE … WHERE id = :id AND state IN
(:allowed)``, rowcount checked): reading a state in Python and then writing it is a race
under Postgres READ COMMITTED. A run does not own its items: `run_items` records which items
each run was asked to finish, and two runs of one episode share them (the claim on an item,
not the run, decides who pays for it).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Table,
    exists,
    func,
    select,
)

from episodic.core.errors import InvalidInput, InvalidTransition, RunNotFound
from episodic.core.runs import INTERRUPTED, Item, Run, RunCounts
from episodic.core.states import (
    ItemState,
    RunState,
    SubmissionState,
)
from episodic.storage import locks, predicates, statements, tx
from episodic.storage.base import utcnow
from episodic.storage.engine import database_label
from episodic.storage.models import (
    CostEntryRow,
    EpisodeRow,
    ItemRow,
    RunItemRow,
    RunRow,
    SubmissionRow,
)
from episodic.storage.tx import idempotent, retry_outages

_episodes: Table = EpisodeRow.__table__  # type: ignore[assignment]
_runs: Table = RunRow.__table__  # type: ignore[assignment]
_items: Table = ItemRow.__table__  # type: ignore[assignment]
_members: Table = RunItemRow.__table__  # type: ignore[assignment]
_subs: Table = SubmissionRow.__table__  # type: ignore[assignment]
_costs: Table = CostEntryRow.__table__  # type: ignore[assignment]


@retry_outages
class RunStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def get_run(self, run_id: str) -> Run:
        with tx.read(self.engine) as conn:
            row = conn.execute(
                select(_runs, _episodes.c.episode_id, _episodes.c.pipeline)
                .join(_episodes, _episodes.c.id == _runs.c.episode_pk)
                .where(_runs.c.id == run_id)
            ).first()
        if row is None:
            raise RunNotFound(run_id, database_label(self.engine))
        return _run(row)

    def run_id_starting(self, prefix: str, shown_at_most: int = 10) -> str:
        """The one run whose id starts with `prefix` (lowercase hex and '-', from
        `episodic.core.ids.parse_run_ref`). Raises `InvalidInput` (exit 2) when none does or several
        do (the first `shown_at_most` of them listed)."""
        with tx.read(self.engine) as conn:
            found = list(
                conn.execute(
                    select(_runs.c.id)
                    .where(_runs.c.id.startswith(prefix, autoescape=True))
                    .order_by(_runs.c.id)
                    .limit(shown_at_most + 1)
                ).scalars()
            )
        if not found:
            raise InvalidInput(f"no run starts with {prefix} (see `episodic runs list`)")
        if len(found) > 1:
            more = ", ..." if len(found) > shown_at_most else ""
            raise InvalidInput(
                f"run id {prefix} is ambiguous: it starts "
                f"{'more than ' if more else ''}{min(len(found), shown_at_most)} runs "
                f"({', '.join(found[:shown_at_most])}{more}): type more of it"
            )
        return str(found[0])

    def list_runs(
        self, pipeline: str, episode_id: str | None = None, limit: int = 100
    ) -> list[Run]:
        query = (
            select(_runs, _episodes.c.episode_id, _episodes.c.pipeline)
            .join(_episodes, _episodes.c.id == _runs.c.episode_pk)
            .where(_episodes.c.pipeline == pipeline)
        )
        if episode_id is not None:
            query = query.where(_episodes.c.episode_id == episode_id)
        with tx.read(self.engine) as conn:
            rows = conn.execute(query.order_by(_runs.c.created_at.desc()).limit(limit)).all()
        return [_run(row) for row in rows]

    def latest_run(self, episode_pk: int, command: str) -> str | None:
        with tx.read(self.engine) as conn:
            return conn.execute(
                select(_runs.c.id)
                .where(_runs.c.episode_pk == episode_pk, _runs.c.command == command)
                .order_by(_runs.c.created_at.desc())
                .limit(1)
            ).scalar()

    def run_state(self, run_id: str) -> str:
        with tx.read(self.engine) as conn:
            state = conn.execute(select(_runs.c.state).where(_runs.c.id == run_id)).scalar()
        if state is None:
            raise RunNotFound(run_id, database_label(self.engine))
        return str(state)

    @idempotent  # a repeat finds the run in `target` and answers False, as for a racer
    def transition_run(
        self,
        run_id: str,
        target: RunState,
        error_text: str | None = None,
        *,
        lease_s: float | None = None,
        keep_store_stop: bool = False,
    ) -> bool:
        """Move the run to `target` with one guarded statement.

        Entering ``running`` starts the run's lease (`lease_s` seconds, renewed by every
        process working on it); any other target ends it. Returns True if this call moved
        the run, False if it already was there (a concurrent caller got there first). Raises
        `InvalidTransition` naming the current state when the move is not allowed from it
        (e.g. a run cancelled meanwhile), `RunNotFound`. `keep_store_stop`: a run paused by a
        media store failure is not moved (`InvalidTransition`: it is paused).
        """
        now = utcnow()
        values: dict[str, Any] = {"state": target, "error_text": error_text, "heartbeat_at": now}
        if target == RunState.RUNNING:
            values.update(
                started_at=now,
                finished_at=None,
                lease_expires_at=now + timedelta(seconds=lease_s or 30.0),
            )
        else:
            values.update(finished_at=now, lease_expires_at=None)
        with tx.write(self.engine) as conn:
            if target == RunState.CANCELLED:  # before the run's row (locks.lock_membership)
                lock_membership_of_runs(conn, [run_id])
            moved = conn.execute(
                statements.move_run(run_id, target, values, keep=keep_store_stop)
            ).rowcount
            if moved and target == RunState.CANCELLED:
                cancel_orphaned_items(conn, [run_id], now)
            if moved:
                return True
            current = conn.execute(select(_runs.c.state).where(_runs.c.id == run_id)).scalar()
        if current is None:
            raise RunNotFound(run_id, database_label(self.engine))
        if current == target:
            return False
        raise InvalidTransition(f"run {run_id} is {current}: it cannot become {target}")

    def abandon_pending(self, run_id: str, reason: str) -> bool:
        """Cancel a run that never started (its creator was interrupted before starting it);
        False if it has started meanwhile (someone joined it): then it is left alone."""
        now = utcnow()
        with tx.write(self.engine) as conn:
            lock_membership_of_runs(conn, [run_id])  # before the run's row
            moved = conn.execute(statements.abandon_pending_run(run_id, now, reason)).rowcount
            if moved:
                cancel_orphaned_items(conn, [run_id], now)
        return bool(moved)

    def run_items(self, run_id: str, states: Iterable[str] | None = None) -> list[Item]:
        query = (
            select(_items)
            .join(_members, _members.c.item_pk == _items.c.id)
            .where(_members.c.run_id == run_id)
        )
        if states is not None:
            query = query.where(_items.c.state.in_(list(states)))
        with tx.read(self.engine) as conn:
            rows = conn.execute(
                query.order_by(_items.c.position, _items.c.part, _items.c.candidate)
            ).all()
        return [item_from_row(row) for row in rows]

    def held_elsewhere(self, run_id: str, owner: str) -> list[Item]:
        """The run's items running under a live claim of another owner (another process
        works on them now)."""
        return self._members_where(
            run_id,
            predicates.held_by_live_claim(utcnow()),
            _items.c.claim_owner != owner,
        )

    def unfinished(self, run_id: str) -> list[Item]:
        """The run's items given up unsent, by any process of the run (this one too: its
        retry found the run paused by another's interrupt): released `INTERRUPTED` with no
        submission open (the intent withdrawn: nothing was sent). Taking one back pays only
        the call that was never made. An item with a submission still open is not among
        them: it was sent, and only a claim that settles it (never a new paid call, even
        under --force-resubmit: that would pay again for a call made in this very run) may
        take it on."""
        open_sub = exists().where(
            _subs.c.item_pk == _items.c.id,
            _subs.c.state.in_(predicates.OPEN),
        )
        return self._members_where(
            run_id,
            _items.c.state == ItemState.FAILED,
            _items.c.error_text == INTERRUPTED,
            ~open_sub,
        )

    def with_open_submission(self, run_id: str) -> set[int]:
        """The pks of the run's unfinished items with a submission open (an intent, an
        accepted job, an unknown outcome) of any run: what a recovery settles before it
        buys anything, and what a run stopped at a limit left uncollected."""
        open_sub = exists().where(
            _subs.c.item_pk == _items.c.id, _subs.c.state.in_(predicates.OPEN)
        )
        with tx.read(self.engine) as conn:
            return set(
                conn.execute(
                    select(_items.c.id)
                    .join(_members, _members.c.item_pk == _items.c.id)
                    .where(
                        _members.c.run_id == run_id,
                        _items.c.state != ItemState.COMPLETED,
                        open_sub,
                    )
                ).scalars()
            )

    def collectible(self, run_id: str, profile: str) -> list[Item]:
        """The run's items whose submission of `profile` holds a provider slot that this run
        may free now without a new paid call: an accepted job not collected, or an intent
        never answered (its process died between the intent and the reply: reconciled by a
        lookup or the same idempotent create, never a second job), on an item that no live
        claim holds (its holder was killed and its lease ran out, or it gave the item up:
        interrupted, or left the job for later collection). A dispatcher refused a slot asks
        for these before it waits: they are what holds its slots (`storage.claims`), so waiting
        for `max_job_s` instead would stand still for jobs it can collect itself. An item
        with an unknown outcome is not among them: its reconcile already found nothing, and
        asking again belongs to an explicit resume."""
        settle = [SubmissionState.ACCEPTED.value, SubmissionState.INTENT.value]
        now = utcnow()
        with tx.read(self.engine) as conn:
            rows = conn.execute(
                select(_items)
                .join(_members, _members.c.item_pk == _items.c.id)
                .where(
                    _members.c.run_id == run_id,
                    _items.c.state != ItemState.COMPLETED,
                    ~predicates.held_by_live_claim(now),
                    exists().where(
                        _subs.c.item_pk == _items.c.id,
                        _subs.c.provider_profile == profile,
                        _subs.c.state.in_(settle),
                    ),
                )
                .order_by(_items.c.position, _items.c.part, _items.c.candidate)
            ).all()
        return [item_from_row(row) for row in rows]

    def _members_where(self, run_id: str, *conditions: ColumnElement[bool]) -> list[Item]:
        query = (
            select(_items)
            .join(_members, _members.c.item_pk == _items.c.id)
            .where(_members.c.run_id == run_id, *conditions)
            .order_by(_items.c.position, _items.c.part, _items.c.candidate)
        )
        with tx.read(self.engine) as conn:
            return [item_from_row(row) for row in conn.execute(query).all()]

    def counts(self, run_id: str) -> RunCounts:
        """Item states of the run's members; paid submissions and cost this run made."""
        with tx.read(self.engine) as conn:
            states: dict[str, int] = {
                row[0]: int(row[1])
                for row in conn.execute(
                    select(_items.c.state, func.count())
                    .join(_members, _members.c.item_pk == _items.c.id)
                    .where(_members.c.run_id == run_id)
                    .group_by(_items.c.state)
                )
            }
            paid = conn.execute(
                select(func.count()).select_from(_subs).where(_subs.c.run_id == run_id)
            ).scalar_one()
            cost = conn.execute(
                select(
                    func.coalesce(func.sum(_costs.c.amount_micros), 0), func.max(_costs.c.currency)
                )
                .join(_subs, _subs.c.id == _costs.c.submission_pk)
                .where(_subs.c.run_id == run_id)
            ).one()
        return RunCounts(
            completed=states.get(ItemState.COMPLETED, 0),
            failed=states.get(ItemState.FAILED, 0),
            pending=states.get(ItemState.PENDING, 0),
            running=states.get(ItemState.RUNNING, 0),
            cancelled=states.get(ItemState.CANCELLED, 0),
            paid_submissions=int(paid),
            cost_micros=int(cost[0]),
            currency=cost[1] or "USD",
        )


def lock_membership_of_runs(conn: Connection, run_ids: Sequence[str]) -> None:
    """`locks.lock_membership` for the episodes of these runs (read without locking a row)."""
    if conn.dialect.name != "postgresql" or not run_ids:
        return
    episodes = select(_runs.c.episode_pk).where(_runs.c.id.in_(list(run_ids))).distinct()
    locks.lock_membership(conn, conn.execute(episodes).scalars())


def cancel_orphaned_items(conn: Connection, run_ids: Sequence[str], now: datetime) -> int:
    """Terminalize the unstarted children of cancelled runs: their ``pending`` items that no
    other active run includes become ``cancelled``, decided under the runs' episodes'
    `locks.lock_membership` (a run being created with one of them is seen). Running items stay
    with their claim holder (its heartbeat sees the cancel and stops; a dead holder's lease
    expires and the sweep fails the item); submissions are never touched (they are the
    ledger's evidence)."""
    if not run_ids:
        return 0
    lock_membership_of_runs(conn, run_ids)  # held already by callers that follow the order
    members = select(_members.c.item_pk).where(_members.c.run_id.in_(list(run_ids)))
    orphaned = predicates.orphaned_pending(members, run_ids)
    return int(conn.execute(statements.cancel_orphaned(orphaned, now)).rowcount)


def _run(row: Any) -> Run:
    return Run(
        run_id=row.id,
        episode_id=row.episode_id,
        pipeline=row.pipeline,
        command=row.command,
        state=row.state,
        params=dict(row.params or {}),
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        error_text=row.error_text,
        heartbeat_at=row.heartbeat_at,
        lease_expires_at=row.lease_expires_at,
        idempotency_key=row.idempotency_key,
        batch_id=row.batch_id,
        fingerprint=row.fingerprint,
        plan_id=row.plan_id,
    )


def item_from_row(row: Any) -> Item:
    return Item(
        pk=row.id,
        idempotency_key=row.idempotency_key,
        position=row.position,
        video_id=row.video_id,
        part=row.part,
        prompt=row.prompt,
        seed=row.seed,
        state=row.state,
        attempts=row.attempts,
        error_text=row.error_text,
        created_at=row.created_at,
        candidate=row.candidate,
    )
