"""A claim once taken: its proof, its renewal, its loading elsewhere, and giving it back.

The holder proves its claim before every paid call (`LeaseStore.still_holds`: the claim is its
own, live, and its run is running), renews it with the run's lease (the heartbeat), and gives
it back as failed (resumable) when it stops: one item, every item of an owner, or a claim whose
task never started (its intent withdrawn: nothing was sent); or as pending when nothing was
sent for it and nothing failed (a provider's throttle paused the run before its call: `put_back`).
A claim's lease is what lets
another process take over the item of a holder that died.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Table,
    and_,
    bindparam,
    exists,
    select,
    true,
    update,
)

from episodic.core.pricing import Reservation
from episodic.core.records import ClaimAction, RefusalReason
from episodic.core.runs import Claim, Item, Refusal, Submission
from episodic.core.states import ItemState, RunState
from episodic.storage import dbapi, locks, predicates, statements, tx
from episodic.storage.base import utcnow
from episodic.storage.budgets import Check, Guard
from episodic.storage.dbapi import DriverSQL
from episodic.storage.ledger import insert_intent, submission_of, withdraw_in
from episodic.storage.models import CostEntryRow, ItemRow, RunRow, SubmissionRow
from episodic.storage.runs import item_from_row
from episodic.storage.throttles import ClaimThrottle
from episodic.storage.tx import idempotent, retry_outages

_runs: Table = RunRow.__table__  # type: ignore[assignment]
_items: Table = ItemRow.__table__  # type: ignore[assignment]
_subs: Table = SubmissionRow.__table__  # type: ignore[assignment]
_costs: Table = CostEntryRow.__table__  # type: ignore[assignment]

_COUNT_ATTEMPT = (
    update(_items)
    .where(_items.c.id == bindparam("b_item"))
    .values(attempts=_items.c.attempts + 1)
    .returning(_items.c.attempts)
)


# The claim is still ours and live, and its run is running (the check before a paid call;
# locked on Postgres where the caller then writes under it).
_HOLDS_SQL = (
    "SELECT id FROM items WHERE id = :b_item AND claim_owner = :b_owner AND "
    f"{predicates.LIVE_CLAIM_SQL} AND EXISTS (SELECT 1 FROM runs WHERE runs.id = :b_run "
    "AND runs.state = 'running')"
)
_HOLDS = DriverSQL(_HOLDS_SQL)
_HOLDS_LOCKED = DriverSQL(_HOLDS_SQL, pg_suffix="FOR NO KEY UPDATE OF items")


@retry_outages
class LeaseStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def new_attempt(
        self,
        claim: Claim,
        profile: str,
        *,
        forced: bool,
        reserve: Reservation,
        guard: Guard | None = None,
    ) -> Submission | Refusal | None:
        """A further paid call for a claimed item (a re-buy, the operator's
        --force-resubmit).

        Re-checks, in the same transaction, that the run is running and the claim still
        ours and live; None if not (stop spending). With `guard`, the call is held against
        the run's caps and its pipeline's period budgets as a claim's is (`storage.budgets`,
        under the same locks): a ``budget`` `Refusal` when it would pass one. While the
        provider throttles `profile` (`episodic.storage.throttles`, any worker heard it) a
        ``throttled`` `Refusal` whose `until` is the moment it takes calls again, as a
        claim's.
        """
        with tx.write(self.engine, lock=None if guard is None else guard.locks) as conn:
            if dbapi.fetch_one(conn, _HOLDS_LOCKED, _holds_params(claim)) is None:
                return None
            throttle = ClaimThrottle(conn, profile, utcnow())
            if throttle.held():
                return Refusal(RefusalReason.THROTTLED, until=throttle.until)
            if guard is not None:
                check = Check(conn, guard, utcnow())
                refused = check.refusal()
                if refused is not None and refused.reason == RefusalReason.BUDGET:
                    return refused  # (a free price's probe wait is the claim's, not a re-buy's)
                reserve = check.reservation()
            return _intend(conn, claim.item, claim.run_id, profile, forced=forced, reserve=reserve)

    def load_claim(
        self,
        item_pk: int,
        run_id: str,
        owner: str,
        action: ClaimAction,
        submission_pk: int | None,
        token: str,
    ) -> Claim | None:
        """The claim another process made, rebuilt from the database by ids (an item task
        on a Dask worker or another machine works the claim its flow made), and consumed:
        its `token` is cleared in the same transaction, so a task executed a second time
        (Dask reschedules a task whose worker died) gets None and sends nothing. None too
        when the item is no longer held by `owner` under a live lease, or its run is no
        longer running (the same proof as `still_holds`, so the claim comes back verified)."""
        with tx.write(self.engine) as conn:
            now = utcnow()  # read with the write lock held
            checked = time.monotonic()
            taken = conn.execute(
                update(_items)
                .where(
                    _items.c.id == item_pk,
                    _items.c.claim_owner == owner,
                    _items.c.claim_token == token,
                    predicates.held_by_live_claim(now),
                    exists().where(
                        and_(_runs.c.id == run_id, _runs.c.state == RunState.RUNNING.value)
                    ),
                )
                .values(claim_token=None)
            ).rowcount
            if not taken:
                return None
            row = conn.execute(select(_items).where(_items.c.id == item_pk)).first()
            if row is None:
                return None
            submission = None
            if submission_pk is not None:
                sub = conn.execute(select(_subs).where(_subs.c.id == submission_pk)).first()
                if sub is None or sub.item_pk != item_pk:
                    return None
                submission = submission_of(sub)
        return Claim(item_from_row(row), run_id, owner, action, submission, None, checked)

    def still_holds(self, claim: Claim) -> bool:
        """The claim is ours, live, and its run is running (checked before paid calls)."""
        with tx.read(self.engine) as conn:
            return dbapi.fetch_one(conn, _HOLDS, _holds_params(claim)) is not None

    @idempotent
    def renew(self, owner: str, run_id: str, lease_s: float) -> str | None:
        """Heartbeat: extend every live claim of `owner` and the run's lease by `lease_s`
        seconds; return the run's state (None if it does not exist)."""
        with tx.write(self.engine) as conn:
            # The clock is read once the write lock is held: a renewal that waited for a
            # busy SQLite writer must not write a lease that has already run out.
            state = conn.execute(select(_runs.c.state).where(_runs.c.id == run_id)).scalar()
            now = utcnow()
            conn.execute(  # the run's lease: alive while any process working on it renews
                update(_runs)  # (its row before its items' rows, as everywhere: locks.in_id_order)
                .where(_runs.c.id == run_id, _runs.c.state == RunState.RUNNING)
                .values(heartbeat_at=now, lease_expires_at=now + timedelta(seconds=lease_s))
            )
            # Only live leases: an expired one may already count as a free provider slot (or
            # be taken over); it is not revived.
            renewed = and_(_items.c.claim_owner == owner, predicates.held_by_live_claim(now))
            conn.execute(
                update(_items)
                .where(locks.in_id_order(_items, renewed), renewed)
                .values(lease_expires_at=now + timedelta(seconds=lease_s))
            )
        return None if state is None else str(state)

    def release(self, claim: Claim, error_text: str) -> bool:
        """The holder gives the item up as failed (resumable); False if it was not ours."""
        return bool(self._give_up(_items.c.id == claim.item.pk, claim.owner, error_text))

    @idempotent
    def put_back(self, claim: Claim, note: str) -> bool:
        """The holder gives the item back as pending, not failed: nothing was sent for it
        (its intent withdrawn) and nothing failed, e.g. a provider's throttle paused the run
        before its call. `note` says why it is still to buy. False if it was not ours."""
        params = {"b_item": claim.item.pk, "b_owner": claim.owner, "b_note": note[:2000]}
        with tx.write(self.engine) as conn:
            return bool(dbapi.rowcount(conn, statements.PUT_BACK_ITEM, params))

    @idempotent
    def give_back_unreceived(self, owner: str, item_pks: Sequence[int], since: datetime) -> int:
        """After a claim call whose reply was lost (its COMMIT may have happened): the items
        among `item_pks` that `owner` holds under a claim made at `since` or later were never
        received, so the intents made with them were never sent. Each such intent is
        withdrawn (attempt given back) and the item released, so the next run submits it
        normally instead of asking a provider that may only look jobs up (and cannot prove
        that nothing was sent). An intent made before `since` is left alone: it may have
        been sent. Returns how many intents were withdrawn."""
        withdrawn = 0
        with tx.write(self.engine) as conn:
            for item_pk in sorted(item_pks):  # ascending, as `locks.in_id_order` locks
                row = conn.execute(
                    select(_items.c.id, _items.c.attempts)
                    .where(_items.c.id == item_pk, _items.c.claim_owner == owner)
                    .with_for_update(key_share=True)
                ).first()
                if row is None:
                    continue
                removed = conn.execute(
                    statements.withdraw_unreceived(item_pk, row.attempts, since)
                ).rowcount
                if removed:
                    conn.execute(
                        update(_items)
                        .where(_items.c.id == item_pk)
                        .values(attempts=_items.c.attempts - 1)
                    )
                    withdrawn += 1
                _give_up_in(
                    conn,
                    _items.c.id == item_pk,
                    owner,
                    "claim interrupted by a lost database connection; nothing was sent",
                )
        return withdrawn

    def release_unstarted(self, claim: Claim, error_text: str) -> bool:
        """Give up a claim whose task ended without finishing (a lost worker, a task that
        failed before its work): the item becomes failed and resumable.

        If the claim's token is still there, its task never loaded it, so its paid call was
        never made: the token is taken in the same transaction (a late execution of the task
        then sends nothing) and the intent is withdrawn, so the next run submits the item
        normally. Otherwise the task may have sent it: the intent stays open and is
        reconciled, never resubmitted. Returns True if the intent was withdrawn."""
        with tx.write(self.engine) as conn:
            unstarted = bool(
                claim.token
                and conn.execute(
                    update(_items)
                    .where(
                        _items.c.id == claim.item.pk,
                        _items.c.claim_owner == claim.owner,
                        _items.c.claim_token == claim.token,
                        _items.c.state == ItemState.RUNNING,
                    )
                    .values(claim_token=None)
                ).rowcount
            )
            withdrawn = False
            if unstarted and claim.action == ClaimAction.SUBMIT and claim.submission is not None:
                withdrawn = withdraw_in(conn, claim, claim.submission)
            _give_up_in(conn, _items.c.id == claim.item.pk, claim.owner, error_text)
        return withdrawn

    def release_all(self, owner: str, error_text: str) -> int:
        """Give up every item `owner` still holds (interrupt, cancellation, crash path)."""
        return self._give_up(true(), owner, error_text)

    def _give_up(self, which: ColumnElement[bool], owner: str, error_text: str) -> int:
        with tx.write(self.engine) as conn:
            return _give_up_in(conn, which, owner, error_text)


def _holds_params(claim: Claim) -> dict[str, Any]:
    return {
        "b_item": claim.item.pk,
        "b_owner": claim.owner,
        "b_now": utcnow(),
        "b_run": claim.run_id,
    }


def _intend(
    conn: Connection, item: Item, run_id: str, profile: str, *, forced: bool, reserve: Reservation
) -> Submission:
    """Count the attempt and commit the intent of a paid call (caller holds the claim)."""
    attempt = conn.execute(_COUNT_ATTEMPT, {"b_item": item.pk}).scalar_one()
    return insert_intent(
        conn, item, run_id, profile, attempt, utcnow(), forced=forced, reserve=reserve
    )


def _give_up_in(conn: Connection, which: ColumnElement[bool], owner: str, error_text: str) -> int:
    """`owner`'s running items among `which` become failed (resumable), in `conn`'s
    transaction; returns how many."""
    return int(conn.execute(statements.give_up_items(which, owner, error_text, utcnow())).rowcount)
