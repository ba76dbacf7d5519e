"""Claims on items (claims and leases, not checks).

A worker *claims* an item before any paid call: one transaction locks the item row (``SELECT …
FOR NO KEY UPDATE`` on Postgres, which excludes every other claim but not the foreign-key checks
of rows that refer to the item; SQLite's ``BEGIN IMMEDIATE`` already serializes writers), checks
the run is still running, decides what the holder does next, records the claim (owner, run,
lease expiry) and, for a new paid call, counts the attempt and commits the submission *intent*
(`storage.ledger`) in the same transaction. Every later write of the holder is guarded by its
ownership (``… WHERE claim_owner = :owner AND state = 'running'``; `episodic.storage.leases`,
`storage.ledger`) and answers False when someone else has taken the item over. So any number
of runs, processes or Prefect workers on one episode split its items, and each item is
submitted once.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy import Connection, Engine, Table

from episodic.core.errors import InvalidTransition
from episodic.core.pricing import Reservation
from episodic.core.records import ClaimAction, RefusalReason
from episodic.core.runs import Claim, Refusal, Submission, claim_live, store_stopped
from episodic.core.states import ItemState, RunState, SubmissionState
from episodic.storage import dbapi, installation, predicates, statements, tx
from episodic.storage.base import utcnow
from episodic.storage.budgets import Check, Guard
from episodic.storage.dbapi import DriverSQL
from episodic.storage.ledger import insert_intent, submission_of
from episodic.storage.models import ItemRow, RunRow
from episodic.storage.provider_outputs import output_gone
from episodic.storage.runs import item_from_row
from episodic.storage.slots import ClaimSlots
from episodic.storage.throttles import ClaimThrottle
from episodic.storage.tx import retry_outages

_runs: Table = RunRow.__table__  # type: ignore[assignment]
_items: Table = ItemRow.__table__  # type: ignore[assignment]

# The claim's reads, hand-written and run on the bare driver (storage/dbapi.py): through
# SQLAlchemy Core each cost about ten times the driver's own time (bench/ledger.py). Its
# writes are `episodic.storage.statements`'.

# The run's state and, for a run admitted for a recorded plan, whether that plan is still
# the episode's newest (a re-planned episode's older runs pay for nothing more).
_RUN_STATE = DriverSQL(
    "SELECT r.state, r.plan_id IS NOT NULL AND r.plan_id <> "
    f"{predicates.newest_plan_sql('r.episode_pk')} AS replanned, r.error_text FROM runs r "
    "WHERE r.id = :b_run"
)


class _ItemRow(NamedTuple):
    """The item's columns a claim reads (`_ITEM_FOR_UPDATE`'s order)."""

    id: int
    idempotency_key: str
    position: int
    video_id: str
    part: int | None
    prompt: str
    seed: int | None
    state: str
    attempts: int
    error_text: str | None
    created_at: datetime
    claim_owner: str | None
    claim_run_id: str | None
    lease_expires_at: datetime | None
    candidate: int | None


_ITEM_COLUMNS = (
    "id, idempotency_key, position, video_id, part, prompt, seed, state, attempts, "
    "error_text, created_at, claim_owner, claim_run_id, lease_expires_at, candidate"
)
_ITEM_FOR_UPDATE = DriverSQL(
    f"SELECT {_ITEM_COLUMNS} FROM items WHERE id = :b_item", pg_suffix="FOR NO KEY UPDATE"
)
# PostgreSQL: the run's state and the batch's items read and locked in one statement. The
# items are locked only when the run may be claimed (running, not re-planned) and then in
# ascending id order, as every other statement that locks several items does
# (`locks.in_id_order`): two transactions taking rows in orders of their own could deadlock
# (a heartbeat's renewal over this owner's items, the sweep's expired ones). Locked, they
# change only by this transaction until it commits. One row, with NULL items, when none is
# locked; no row when the run does not exist.
_RUN_AND_ITEMS = DriverSQL(
    f"WITH r AS ({_RUN_STATE.sqlite}), l AS MATERIALIZED (SELECT {_ITEM_COLUMNS} FROM items "
    "WHERE id = ANY(:b_items) AND EXISTS (SELECT 1 FROM r WHERE r.state = 'running' AND "
    "r.replanned IS NOT TRUE) ORDER BY id FOR NO KEY UPDATE) "
    "SELECT r.state, r.replanned, r.error_text, l.* FROM r LEFT JOIN l ON true ORDER BY l.id"
)


class _SubRow(NamedTuple):
    """A submission's columns a claim reads (`_OPEN_SUB`'s order)."""

    id: int
    item_pk: int
    attempt: int
    client_reference: str
    state: str
    remote_ref: str | None


class _Intended(NamedTuple):
    """A new paid call the batch decided on, its take and intent written with the batch's
    others (PostgreSQL: `statements.TAKE_AND_INTEND`) when the batch is decided."""

    row: _ItemRow
    reserve: Reservation


def _item_row(found: Sequence[Any]) -> _ItemRow:
    row = _ItemRow._make(found)
    created = dbapi.moment(row.created_at)
    assert created is not None  # NOT NULL
    return row._replace(created_at=created, lease_expires_at=dbapi.moment(row.lease_expires_at))


def _sub_row(found: Sequence[Any] | None) -> _SubRow | None:
    return None if found is None else _SubRow._make(found)


_OPEN_SUB = DriverSQL(
    "SELECT id, item_pk, attempt, client_reference, state, remote_ref FROM submissions "
    f"WHERE item_pk = :b_item AND {predicates.OPEN_SQL} ORDER BY id DESC LIMIT 1"
)


@retry_outages
class ClaimStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def installation(self) -> str:
        """This database's installation id (the scope of its provider references)."""
        return installation.installation_id(self.engine)

    def claim(
        self,
        item_pk: int,
        run_id: str,
        owner: str,
        *,
        lease_s: float,
        max_attempts: int,
        profile: str,
        provider_limit: int | None = None,
        max_job_s: float | None = None,
        allow_retry: bool = True,
        reserve: Reservation | None = None,
        guard: Guard | None = None,
        settle_only: bool = False,
    ) -> Claim | Refusal:
        """Claim the item for `owner` (and intend a paid call if one is due), atomically.

        Refusals: ``stopped`` (the run is cancelled, completed or pending, or paused by a
        media store failure), ``reopen`` (it
        is failed or paused: concluded, reaped or interrupted elsewhere; the caller, which
        still has work, may reopen it), ``done``,
        ``busy`` (another owner's lease is live), ``lost`` (failed, its paid output gone
        at the provider: `episodic.storage.provider_outputs`), ``exhausted`` (``max_attempts`` paid
        calls made and none open), ``throttled`` (`provider_limit` slots of `profile` are
        taken, in any run, process or machine: see below; or the provider refused the
        profile for now and the moment it gave to ask again, `episodic.storage.throttles`, is still
        to come) and, with
        ``allow_retry=False`` (a run following another run's work), ``failed`` (its holder
        gave it up: not retried by a follower).

        A slot is taken by an item of `profile` running under a live lease and, with
        `max_job_s` (seconds), by an item with an open submission (intent, unknown,
        accepted) of `profile` made less than `max_job_s` ago: the provider's job runs
        whatever became of the claim that sent it, so an interrupted or killed holder, or a
        job left for later collection, keeps its slot until the job is collected or
        `max_job_s` has passed. A killed holder's other slots free when its leases expire.
        The slots are counted under a lock per profile (a Postgres advisory lock; SQLite's
        write lock), so concurrent claimers never both take the last one.

        With `guard`, a new paid call is also held against the run's caps and its pipeline's
        period budgets (`episodic.storage.budgets`, under their locks): ``budget`` (its `detail`
        says which limit, the spend and what is in flight) when it would pass one.

        With `settle_only`, the item is claimed only to settle its open submission (collect
        an accepted job, reconcile an intent or an unknown outcome: nothing new is paid);
        one that would need a new paid call is refused ``settle only``.
        """
        return self.claim_many(
            [(item_pk, allow_retry)],
            run_id,
            owner,
            lease_s=lease_s,
            max_attempts=max_attempts,
            profile=profile,
            provider_limit=provider_limit,
            max_job_s=max_job_s,
            reserve=reserve,
            guard=guard,
            settle_only=settle_only,
        )[0]

    def claim_many(
        self,
        items: Sequence[tuple[int, bool]],
        run_id: str,
        owner: str,
        *,
        lease_s: float,
        max_attempts: int,
        profile: str,
        provider_limit: int | None = None,
        max_job_s: float | None = None,
        reserve: Reservation | None = None,
        guard: Guard | None = None,
        settle_only: bool = False,
    ) -> list[Claim | Refusal]:
        """`claim` for several items (pk, allow_retry) in one transaction, in order: one
        write instead of one per item for a dispatcher that fills many slots at once. After
        the first ``throttled`` refusal the rest are refused the same way, unclaimed; after
        the first ``budget`` refusal the rest are claimed only to settle what they have open
        (collecting costs nothing new), and a new paid call is refused ``budget`` as the
        first was."""
        locks = [f"provider:{profile}"] if provider_limit is not None else []
        if guard is not None:
            locks += guard.locks
        slots = None if provider_limit is None else (max(1, provider_limit), max_job_s)
        return self._claim_batch(
            items,
            run_id,
            owner,
            locks,
            lease_s,
            max_attempts,
            profile,
            slots,
            reserve or Reservation.none(),
            guard,
            settle_only,
        )

    def _claim_batch(
        self,
        items: Sequence[tuple[int, bool]],
        run_id: str,
        owner: str,
        locks: list[str],
        lease_s: float,
        max_attempts: int,
        profile: str,
        slots: tuple[int, float | None] | None,
        reserve: Reservation,
        guard: Guard | None,
        settle_only: bool,
    ) -> list[Claim | Refusal]:
        over: Refusal | None = None  # the batch's first budget refusal
        # Every advisory lock first, in the one global order (`storage.locks`); then the run.
        with tx.write(self.engine, lock=locks) as conn:
            checked = time.monotonic()  # the proof's age counts from before the run is read
            # The run is decided before any item row is locked: cancelling a run locks the
            # run's row and then its items (`RunStore.transition_run`, the sweep), so a claim
            # that held items while it cancelled a re-planned run could deadlock with them.
            read: dict[int, Sequence[Any]] = {}
            postgres = conn.dialect.name == "postgresql"
            if postgres:
                found = dbapi.fetch_all(
                    conn, _RUN_AND_ITEMS, {"b_run": run_id, "b_items": [pk for pk, _ in items]}
                )
                found_run = found[0][:3] if found else None
                read = {int(row[3]): row[3:] for row in found if row[3] is not None}
            else:
                found_run = dbapi.fetch_one(conn, _RUN_STATE, {"b_run": run_id})
            stopped = self._run_refusal(conn, run_id, found_run)
            if stopped is not None:
                return [stopped] * len(items)
            now = utcnow()  # read with the write lock held (a waited-for lock ages a lease)
            # each read at the batch's first question, then kept in memory (PostgreSQL: all
            # read at once, one round trip)
            money = None if guard is None else Check(conn, guard, now)
            throttle = ClaimThrottle(conn, profile, now)
            limit = None if slots is None else (slots[0], ClaimSlots(conn, profile, now, slots[1]))
            if postgres:
                parts = [throttle.part()]
                parts += [] if limit is None else [limit[1].part()]
                parts += [] if money is None else money.parts()
                answers = dbapi.fetch_parts(conn, parts)
                throttle.given(answers[0])
                if limit is not None:
                    limit[1].given(answers[1])
                if money is not None:
                    money.given(answers[2 if limit is not None else 1 :])
            decided: list[Claim | Refusal | _Intended] = []
            for item_pk, allow_retry in items:
                if any(isinstance(a, _Intended) and a.row.id == item_pk for a in decided):
                    # the same item twice in one batch: the first take is written, and the
                    # item read again, before the second is decided
                    decided[:] = _intend(
                        conn, decided, run_id, owner, profile, lease_s, now, checked
                    )
                last = decided[-1] if decided else None
                if isinstance(last, Refusal) and last.reason == RefusalReason.THROTTLED:
                    decided.append(last)
                    continue
                answer = self._claim_in(
                    conn,
                    now,
                    checked,
                    read.pop(item_pk, None),  # a row this batch already moved is read again
                    item_pk,
                    run_id,
                    owner,
                    lease_s=lease_s,
                    max_attempts=max_attempts,
                    profile=profile,
                    slots=limit,
                    allow_retry=allow_retry,
                    reserve=reserve,
                    money=money,
                    settle_only=settle_only or over is not None,
                    throttle=throttle,
                )
                if isinstance(answer, Refusal) and answer.reason == RefusalReason.BUDGET:
                    over = over or answer
                elif (
                    over is not None
                    and isinstance(answer, Refusal)
                    and answer.reason == RefusalReason.SETTLE_ONLY
                ):
                    answer = over  # a new paid call, refused at the limit as the first was
                decided.append(answer)
            return _intend(conn, decided, run_id, owner, profile, lease_s, now, checked)

    @staticmethod
    def _run_refusal(
        conn: Connection, run_id: str, found_run: Sequence[Any] | None
    ) -> Refusal | None:
        """Why no item of the run may be claimed now, or None (it is running): from its
        `_RUN_STATE` row (None: no such run)."""
        run_state, replanned, error_text = (
            found_run if found_run is not None else (None, False, None)
        )
        # Paused at a media store failure: no process buys more until a resume.
        if run_state == RunState.PAUSED and store_stopped(error_text):
            return Refusal(RefusalReason.STOPPED)
        # Concluded by another process, reaped by the sweep while this one was frozen, or
        # paused by another process's interrupt: this one still has work and may reopen it.
        if run_state in (RunState.FAILED, RunState.PAUSED):
            return Refusal(RefusalReason.REOPEN)
        if run_state != RunState.RUNNING:
            return Refusal(RefusalReason.STOPPED)
        if replanned:  # the episode was re-planned: what this run was for is not wanted
            dbapi.rowcount(conn, statements.CANCEL_REPLANNED, {"b_run": run_id, "b_now": utcnow()})
            return Refusal(RefusalReason.STOPPED)
        return None

    def _claim_in(
        self,
        conn: Connection,
        now: datetime,
        checked: float,
        found: Sequence[Any] | None,
        item_pk: int,
        run_id: str,
        owner: str,
        *,
        lease_s: float,
        max_attempts: int,
        profile: str,
        slots: tuple[int, ClaimSlots] | None,
        allow_retry: bool,
        reserve: Reservation,
        money: Check | None = None,
        settle_only: bool = False,
        throttle: ClaimThrottle | None = None,
    ) -> Claim | Refusal | _Intended:
        if found is None:
            found = dbapi.fetch_one(conn, _ITEM_FOR_UPDATE, {"b_item": item_pk})
        if found is None:
            raise LookupError(f"item {item_pk} does not exist")
        row = _item_row(found)
        if row.state == ItemState.COMPLETED:
            return Refusal(RefusalReason.DONE, row.claim_run_id)
        if claim_live(row.state, row.lease_expires_at, now) and row.claim_owner != owner:
            return Refusal(RefusalReason.BUSY, row.claim_run_id)
        # Every submission counted an attempt (a withdrawn one gave it back): an item never
        # attempted has none open, and needs no look for one.
        sub = (
            _sub_row(dbapi.fetch_one(conn, _OPEN_SUB, {"b_item": item_pk}))
            if row.attempts
            else None
        )
        if sub is None and row.state == ItemState.FAILED and output_gone(conn, item_pk):
            return Refusal(RefusalReason.LOST, row.claim_run_id)
        if sub is None and row.attempts >= max_attempts:
            return Refusal(RefusalReason.EXHAUSTED)
        if sub is None and not allow_retry and row.state == ItemState.FAILED:
            return Refusal(RefusalReason.FAILED, row.claim_run_id)
        if sub is None and settle_only:  # nothing open to settle: it needs a new paid call
            return Refusal(RefusalReason.SETTLE_ONLY)
        # An item with a submission open already holds its slot (the count below is of the
        # *other* items): settling it (collect, reconcile) takes no new one, and frees one.
        # Only a new paid call waits for a slot; so a run whose slots are held by its own
        # accepted jobs can always take them back (`collectible`).
        if sub is None and slots is not None and slots[1].taken_by_others(item_pk) >= slots[0]:
            return Refusal(RefusalReason.THROTTLED)
        # The provider refused this profile for now (any worker heard it): no new paid call
        # until the moment it gave; settling an open submission needs no create.
        if sub is None and throttle is not None and throttle.held():
            return Refusal(RefusalReason.THROTTLED, until=throttle.until)
        # A new paid call is held against the run's caps and the period budgets (their
        # locks were taken with the provider's, before the run and any item row).
        if sub is None and money is not None and (refused := money.refusal()) is not None:
            return refused
        lease = now + timedelta(seconds=lease_s)
        if sub is None and money is not None:  # reserved at what every check counts it at
            reserve = money.reservation()
        claim: Claim | _Intended
        if sub is None and conn.dialect.name == "postgresql":  # written with the batch's others
            claim = _Intended(row, reserve)
        else:
            claim = _take(conn, row, sub, run_id, owner, profile, lease, now, checked, reserve)
        if slots is not None:
            slots[1].took(item_pk)
        if sub is None and money is not None:
            money.took()
        return claim


def _take(
    conn: Connection,
    row: _ItemRow,
    sub: _SubRow | None,
    run_id: str,
    owner: str,
    profile: str,
    lease: datetime,
    now: datetime,
    checked: float,
    reserve: Reservation,
) -> Claim:
    """The claim is recorded on the item (owner, run, profile, a fresh token, the lease until
    `lease`). With `sub` open the holder settles it (``collect`` an accepted job, else
    ``reconcile``); without one the attempt is counted and the intent of a new paid call
    committed with the claim (``submit``)."""
    params = {
        "b_item": row.id,
        "b_owner": owner,
        "b_run": run_id,
        "b_profile": profile,
        "b_lease": lease,
        "b_now": now,
        "b_token": (token := uuid.uuid4().hex),
    }
    item = item_from_row(row)
    if sub is not None:
        if dbapi.rowcount(conn, statements.TAKE_ITEM, params) != 1:
            raise _not_taken(row)
        action = (
            ClaimAction.COLLECT if sub.state == SubmissionState.ACCEPTED else ClaimAction.RECONCILE
        )
        return Claim(item, run_id, owner, action, submission_of(sub), token, checked)
    attempt = dbapi.scalar(conn, statements.TAKE_ITEM_AND_COUNT, params)
    if attempt is None:
        raise _not_taken(row)
    submission = insert_intent(
        conn, item, run_id, profile, attempt, now, forced=False, reserve=reserve
    )
    return Claim(item, run_id, owner, ClaimAction.SUBMIT, submission, token, checked)


def _intend(
    conn: Connection,
    decided: list[Claim | Refusal | _Intended],
    run_id: str,
    owner: str,
    profile: str,
    lease_s: float,
    now: datetime,
    checked: float,
) -> list[Claim | Refusal]:
    """`decided` with every new paid call taken and intended, all in one statement
    (PostgreSQL: `statements.TAKE_AND_INTEND`), as `_take` takes one: the attempt counted, the
    intent committed with the claim (``submit``)."""
    intended = [d for d in decided if isinstance(d, _Intended)]
    if not intended:
        return [d for d in decided if not isinstance(d, _Intended)]
    tokens = {d.row.id: uuid.uuid4().hex for d in intended}
    currencies = {d.reserve.currency for d in intended}
    assert len(currencies) == 1  # one profile's price per batch
    found = dbapi.fetch_all(
        conn,
        statements.TAKE_AND_INTEND,
        {
            "b_items": list(tokens),
            "b_tokens": list(tokens.values()),
            "b_reserves": [d.reserve.micros for d in intended],
            "b_owner": owner,
            "b_run": run_id,
            "b_profile": profile,
            "b_lease": now + timedelta(seconds=lease_s),
            "b_now": now,
            "b_currency": currencies.pop(),
        },
    )
    made = {int(item_pk): (int(pk), int(attempt), ref) for item_pk, pk, attempt, ref in found}
    out: list[Claim | Refusal] = []
    for d in decided:
        if not isinstance(d, _Intended):
            out.append(d)
            continue
        if d.row.id not in made:
            raise _not_taken(d.row)
        pk, attempt, reference = made[d.row.id]
        item = item_from_row(d.row)
        submission = Submission(pk, item.pk, attempt, reference, SubmissionState.INTENT, None)
        token = tokens[d.row.id]
        out.append(Claim(item, run_id, owner, ClaimAction.SUBMIT, submission, token, checked))
    return out


def _not_taken(row: _ItemRow) -> InvalidTransition:
    """The claim decided to take an item its statement's guard refused: the decision and the
    guard disagree (a defect), so the transaction rolls back and nothing is paid."""
    return InvalidTransition(
        f"item {row.id} ({row.state}) could not be claimed: its guard refused the move"
    )
