"""Claims on items and the spend ledger's writes (DESIGN 5: claims and leases, not checks).

A worker *claims* an item before any paid call: one transaction locks the item row (``SELECT …
FOR NO KEY UPDATE`` on Postgres, which excludes every other claim but not the foreign-key checks
of rows that refer to the item; SQLite's ``BEGIN IMMEDIATE`` already serializes writers), checks
the run is still running, decides what the holder does next, records the claim (owner, run,
lease expiry) and, for a new paid call, counts the attempt and commits the submission *intent*
in the same transaction. Every later write of the holder is guarded by its ownership (``… WHERE
claim_owner = :owner AND state = 'running'``) and answers False when someone else has taken the
item over; submissions move only along their own states. So any number of runs, processes or
Prefect workers on one episode split its items, and each item is submitted once.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Table,
    and_,
    bindparam,
    delete,
    exists,
    select,
    true,
    update,
)
from sqlalchemy.exc import IntegrityError

from core.runs import REPLANNED, Claim, Item, Refusal, Submission
from core.states import ItemState, RunState, SubmissionState
from storage import hot, installation, tx
from storage.base import utcnow
from storage.hot import Hot
from storage.models import CostEntryRow, ItemRow, RunItemRow, RunRow, SubmissionRow
from storage.runs import OPEN_SUBMISSION_STATES, item_from_row
from storage.tx import idempotent, retry_outages

_runs: Table = RunRow.__table__  # type: ignore[assignment]
_items: Table = ItemRow.__table__  # type: ignore[assignment]
_subs: Table = SubmissionRow.__table__  # type: ignore[assignment]
_costs: Table = CostEntryRow.__table__  # type: ignore[assignment]
_members: Table = RunItemRow.__table__  # type: ignore[assignment]

_OPEN = [s.value for s in OPEN_SUBMISSION_STATES]
_UNSETTLED = [SubmissionState.INTENT.value, SubmissionState.UNKNOWN.value]


# The hot path's statements, hand-written and run on the bare driver (storage/hot.py): through
# SQLAlchemy Core each cost about ten times the driver's own time (bench/ledger.py).


def _states_sql(states: list[str]) -> str:
    """``(state = 'a' OR state = 'b')``: plain equalities, literal names from our own enums."""
    return "(" + " OR ".join(f"state = '{state}'" for state in states) + ")"


_OPEN_SQL = _states_sql(_OPEN)
_UNSETTLED_SQL = _states_sql(_UNSETTLED)
# The run's state and, for a run admitted for a recorded plan, whether that plan is still
# the episode's newest (a re-planned episode's older runs pay for nothing more).
_RUN_STATE = Hot(
    "SELECT r.state, r.plan_id IS NOT NULL AND r.plan_id <> (SELECT max(p.id) FROM "
    "episode_plans p WHERE p.episode_pk = r.episode_pk) FROM runs r WHERE r.id = :b_run"
)
# Postgres only (SQLite's writer lock serializes every writer already).
_LOCK_ITEMS = Hot("SELECT id FROM items WHERE id = ANY(:b_items) ORDER BY id FOR NO KEY UPDATE")
_CANCEL_REPLANNED = Hot(
    f"UPDATE runs SET state = 'cancelled', error_text = '{REPLANNED}', finished_at = :b_now "
    "WHERE id = :b_run AND state = 'running'"
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


_ITEM_FOR_UPDATE = Hot(
    "SELECT id, idempotency_key, position, video_id, part, prompt, seed, state, attempts, "
    "error_text, created_at, claim_owner, claim_run_id, lease_expires_at, candidate FROM items "
    "WHERE id = :b_item",
    pg_suffix="FOR NO KEY UPDATE",
)


class _SubRow(NamedTuple):
    """A submission's columns a claim reads (`_OPEN_SUB`'s order)."""

    id: int
    item_pk: int
    attempt: int
    client_reference: str
    state: str
    remote_ref: str | None


def _item_row(found: Sequence[Any]) -> _ItemRow:
    row = _ItemRow._make(found)
    created = hot.moment(row.created_at)
    assert created is not None  # NOT NULL
    return row._replace(created_at=created, lease_expires_at=hot.moment(row.lease_expires_at))


def _sub_row(found: Sequence[Any] | None) -> _SubRow | None:
    return None if found is None else _SubRow._make(found)


_OPEN_SUB = Hot(
    "SELECT id, item_pk, attempt, client_reference, state, remote_ref FROM submissions "
    f"WHERE item_pk = :b_item AND {_OPEN_SQL} ORDER BY id DESC LIMIT 1"
)
# The slots a profile's jobs take: its items running under a live lease, and the items with
# an open submission of the profile made within its `max_job_s` (a job the provider accepted
# runs there whatever became of the claim that sent it: an interrupted or killed holder, a
# job left for later collection). An item with both counts once.
_RUNNING_SLOTS = (
    "SELECT id AS item FROM items WHERE claim_profile = :b_profile AND state = 'running' "
    "AND lease_expires_at > :b_now AND id != :b_item"
)
_IN_FLIGHT = Hot(f"SELECT count(*) FROM ({_RUNNING_SLOTS}) AS slots")
_IN_FLIGHT_WITH_JOBS = Hot(
    f"SELECT count(*) FROM ({_RUNNING_SLOTS} UNION SELECT item_pk AS item FROM submissions "
    f"WHERE provider_profile = :b_profile AND {_OPEN_SQL} AND created_at > :b_since "
    "AND item_pk != :b_item) AS slots"
)
_TAKE = (
    "UPDATE items SET state = 'running', error_text = NULL, claim_owner = :b_owner, "
    "claim_run_id = :b_run, claim_profile = :b_profile, claim_token = :b_token, "
    "lease_expires_at = :b_lease, started_at = :b_now, finished_at = NULL"
)
_TAKE_ITEM = Hot(f"{_TAKE} WHERE id = :b_item")
# The same for a new paid call: the attempt is counted in the same statement.
_TAKE_ITEM_AND_COUNT = Hot(
    f"{_TAKE}, attempts = attempts + 1 WHERE id = :b_item RETURNING attempts"
)
_COUNT_ATTEMPT = (
    update(_items)
    .where(_items.c.id == bindparam("b_item"))
    .values(attempts=_items.c.attempts + 1)
    .returning(_items.c.attempts)
)
# The client reference is this installation's id, the item's key and the attempt
# (storage.installation), built from the database's own row in the same statement.
_INSERT_INTENT = Hot(
    "INSERT INTO submissions (item_pk, run_id, attempt, client_reference, provider_profile, "
    "state, forced, created_at) VALUES (:b_item, :b_run, :b_attempt, "
    f"{installation.REFERENCE_SQL}, :b_profile, 'intent', :b_forced, :b_now) "
    "RETURNING id, client_reference"
)
# The claim is still ours and live, and its run is running (the check before a paid call;
# locked on Postgres where the caller then writes under it).
_HOLDS_SQL = (
    "SELECT id FROM items WHERE id = :b_item AND claim_owner = :b_owner AND state = 'running' "
    "AND lease_expires_at > :b_now AND EXISTS (SELECT 1 FROM runs WHERE runs.id = :b_run "
    "AND runs.state = 'running')"
)
_HOLDS = Hot(_HOLDS_SQL)
_HOLDS_LOCKED = Hot(_HOLDS_SQL, pg_suffix="FOR NO KEY UPDATE OF items")
_ACCEPT = Hot(
    "UPDATE submissions SET state = 'accepted', remote_ref = :b_remote, error_text = NULL, "
    f"accepted_at = :b_now WHERE id = :b_sub AND {_UNSETTLED_SQL}"
)
_COMPLETE_ITEM = Hot(
    "UPDATE items SET state = 'completed', error_text = NULL, output_path = :b_path, "
    "output_sha256 = :b_sha, lease_expires_at = NULL, finished_at = :b_now "
    "WHERE id = :b_item AND claim_owner = :b_owner AND state = 'running'"
)
_SUCCEED_SUB = Hot(
    "UPDATE submissions SET state = 'succeeded', finished_at = :b_now "
    "WHERE id = :b_sub AND state = 'accepted'"
)
_INSERT_COST = Hot(
    "INSERT INTO cost_entries (episode_pk, submission_pk, amount_minor, currency, recorded_at) "
    "VALUES (:b_episode, :b_sub, :b_amount, :b_currency, :b_now)"
)


def _held(conn: Connection, claim: Claim) -> bool:
    """Whether `claim.owner` still holds the item, its row locked until the transaction ends
    (a takeover waits for this transaction, or this one sees the takeover)."""
    return (
        conn.execute(
            select(_items.c.id)
            .where(_items.c.id == claim.item.pk, _items.c.claim_owner == claim.owner)
            .with_for_update(key_share=True)
        ).first()
        is not None
    )


class _Lost(Exception):
    """Rolls a guarded transaction back: the claim or the submission moved meanwhile."""


@retry_outages
class ClaimStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def installation(self) -> str:
        """This database's installation id (the scope of its provider references)."""
        return installation.installation_id(self.engine)

    # ------------------------------------------------------------------ claiming
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
    ) -> Claim | Refusal:
        """Claim the item for `owner` (and intend a paid call if one is due), atomically.

        Refusals: ``stopped`` (the run is cancelled, completed or pending), ``reopen`` (it
        is failed or paused: concluded, reaped or interrupted elsewhere; the caller, which
        still has work, may reopen it), ``done``,
        ``busy`` (another owner's lease is live), ``exhausted`` (``max_attempts`` paid
        calls made and none open), ``throttled`` (`provider_limit` slots of `profile` are
        taken, in any run, process or machine: see below) and, with
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
    ) -> list[Claim | Refusal]:
        """`claim` for several items (pk, allow_retry) in one transaction, in order: one
        write instead of one per item for a dispatcher that fills many slots at once. After
        the first ``throttled`` refusal the rest are refused the same way, unclaimed."""
        lock = f"provider:{profile}" if provider_limit is not None else None
        slots = None if provider_limit is None else (max(1, provider_limit), max_job_s)
        return self._claim_batch(items, run_id, owner, lock, lease_s, max_attempts, profile, slots)

    def _claim_batch(
        self,
        items: Sequence[tuple[int, bool]],
        run_id: str,
        owner: str,
        lock: str | None,
        lease_s: float,
        max_attempts: int,
        profile: str,
        slots: tuple[int, float | None] | None,
    ) -> list[Claim | Refusal]:
        answers: list[Claim | Refusal] = []
        with tx.write(self.engine, lock=lock) as conn:
            checked = time.monotonic()  # the proof's age counts from before the run is read
            # The run is decided before any item row is locked: cancelling a run locks the
            # run's row and then its items (`RunStore.transition_run`, the sweep), so a claim
            # that held items while it cancelled a re-planned run could deadlock with them.
            stopped = self._run_refusal(conn, run_id)
            if stopped is not None:
                return [stopped] * len(items)
            if len(items) > 1 and conn.dialect.name == "postgresql":
                # Every row of the batch is locked first, in ascending id order, as every
                # other statement that locks several items does (`tx.in_id_order`): two
                # transactions taking rows in orders of their own could deadlock (a
                # heartbeat's renewal over this owner's items, the sweep's expired ones).
                hot.fetch_all(conn, _LOCK_ITEMS, {"b_items": [pk for pk, _ in items]})
            now = utcnow()  # read with the write lock held (a waited-for lock ages a lease)
            for item_pk, allow_retry in items:
                if (
                    answers
                    and isinstance(answers[-1], Refusal)
                    and answers[-1].reason == "throttled"
                ):
                    answers.append(answers[-1])
                    continue
                answers.append(
                    self._claim_in(
                        conn,
                        now,
                        checked,
                        item_pk,
                        run_id,
                        owner,
                        lease_s=lease_s,
                        max_attempts=max_attempts,
                        profile=profile,
                        slots=slots,
                        allow_retry=allow_retry,
                    )
                )
        return answers

    @staticmethod
    def _run_refusal(conn: Connection, run_id: str) -> Refusal | None:
        """Why no item of the run may be claimed now, or None (it is running)."""
        found_run = hot.fetch_one(conn, _RUN_STATE, {"b_run": run_id})
        run_state, replanned = found_run if found_run is not None else (None, False)
        # Concluded by another process, reaped by the sweep while this one was frozen, or
        # paused by another process's interrupt: this one still has work and may reopen it.
        if run_state in (RunState.FAILED, RunState.PAUSED):
            return Refusal("reopen")
        if run_state != RunState.RUNNING:
            return Refusal("stopped")
        if replanned:  # the episode was re-planned: what this run was for is not wanted
            hot.rowcount(conn, _CANCEL_REPLANNED, {"b_run": run_id, "b_now": utcnow()})
            return Refusal("stopped")
        return None

    def _claim_in(
        self,
        conn: Connection,
        now: datetime,
        checked: float,
        item_pk: int,
        run_id: str,
        owner: str,
        *,
        lease_s: float,
        max_attempts: int,
        profile: str,
        slots: tuple[int, float | None] | None,
        allow_retry: bool,
    ) -> Claim | Refusal:
        found = hot.fetch_one(conn, _ITEM_FOR_UPDATE, {"b_item": item_pk})
        if found is None:
            raise LookupError(f"item {item_pk} does not exist")
        row = _item_row(found)
        if row.state == ItemState.COMPLETED:
            return Refusal("done", row.claim_run_id)
        live = row.lease_expires_at is not None and row.lease_expires_at > now
        if row.state == ItemState.RUNNING and live and row.claim_owner != owner:
            return Refusal("busy", row.claim_run_id)
        # Every submission counted an attempt (a withdrawn one gave it back): an item never
        # attempted has none open, and needs no look for one.
        sub = (
            _sub_row(hot.fetch_one(conn, _OPEN_SUB, {"b_item": item_pk})) if row.attempts else None
        )
        if sub is None and row.attempts >= max_attempts:
            return Refusal("exhausted")
        if sub is None and not allow_retry and row.state == ItemState.FAILED:
            return Refusal("failed", row.claim_run_id)
        # An item with a submission open already holds its slot (the count below is of the
        # *other* items): settling it (collect, reconcile) takes no new one, and frees one.
        # Only a new paid call waits for a slot; so a run whose slots are held by its own
        # accepted jobs can always take them back (`collectible`).
        if (
            sub is None
            and slots is not None
            and _in_flight(conn, profile, item_pk, now, slots[1]) >= slots[0]
        ):
            return Refusal("throttled")
        params = {
            "b_item": item_pk,
            "b_owner": owner,
            "b_run": run_id,
            "b_profile": profile,
            "b_lease": now + timedelta(seconds=lease_s),
            "b_now": now,
            "b_token": (token := uuid.uuid4().hex),
        }
        item = item_from_row(row)
        if sub is not None:
            hot.rowcount(conn, _TAKE_ITEM, params)
            action = "collect" if sub.state == SubmissionState.ACCEPTED else "reconcile"
            return Claim(item, run_id, owner, action, _submission(sub), token, checked)
        attempt = hot.scalar(conn, _TAKE_ITEM_AND_COUNT, params)
        submission = _insert_intent(conn, item, run_id, profile, attempt, now, forced=False)
        return Claim(item, run_id, owner, "submit", submission, token, checked)

    def collectible(self, run_id: str, profile: str) -> list[Item]:
        """The run's items whose submission of `profile` holds a provider slot that this run
        may free now without a new paid call: an accepted job not collected, or an intent
        never answered (its process died between the intent and the reply: reconciled by a
        lookup or the same idempotent create, never a second job), on an item that no live
        claim holds (its holder was killed and its lease ran out, or it gave the item up:
        interrupted, or left the job for later collection). A dispatcher refused a slot asks
        for these before it waits: they are what holds its slots (`_claim_in`), so waiting
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
                    ~and_(
                        _items.c.state == ItemState.RUNNING,
                        _items.c.lease_expires_at.is_not(None),
                        _items.c.lease_expires_at > now,
                    ),
                    exists().where(
                        _subs.c.item_pk == _items.c.id,
                        _subs.c.provider_profile == profile,
                        _subs.c.state.in_(settle),
                    ),
                )
                .order_by(_items.c.position, _items.c.part, _items.c.candidate)
            ).all()
        return [item_from_row(row) for row in rows]

    def new_attempt(self, claim: Claim, profile: str, *, forced: bool) -> Submission | None:
        """A further paid call for a claimed item (operator's --force-resubmit).

        Re-checks, in the same transaction, that the run is running and the claim still
        ours and live; None if not (stop spending).
        """
        with tx.write(self.engine) as conn:
            if hot.fetch_one(conn, _HOLDS_LOCKED, _holds_params(claim)) is None:
                return None
            return _intend(conn, claim.item, claim.run_id, profile, forced=forced)

    def load_claim(
        self,
        item_pk: int,
        run_id: str,
        owner: str,
        action: str,
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
                    _items.c.state == ItemState.RUNNING,
                    _items.c.lease_expires_at > now,
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
                submission = _submission(sub)
        return Claim(item_from_row(row), run_id, owner, action, submission, None, checked)

    def still_holds(self, claim: Claim) -> bool:
        """The claim is ours, live, and its run is running (checked before paid calls)."""
        with tx.read(self.engine) as conn:
            return hot.fetch_one(conn, _HOLDS, _holds_params(claim)) is not None

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
                update(_runs)  # (its row before its items' rows, as everywhere: tx.in_id_order)
                .where(_runs.c.id == run_id, _runs.c.state == RunState.RUNNING)
                .values(heartbeat_at=now, lease_expires_at=now + timedelta(seconds=lease_s))
            )
            renewed = and_(  # only live leases: an expired one may already count as a free
                _items.c.claim_owner == owner,  # provider slot (or be taken over); it is not
                _items.c.state == ItemState.RUNNING,  # revived
                _items.c.lease_expires_at > now,
            )
            conn.execute(
                update(_items)
                .where(tx.in_id_order(_items, renewed), renewed)
                .values(lease_expires_at=now + timedelta(seconds=lease_s))
            )
        return None if state is None else str(state)

    def release(self, claim: Claim, error_text: str) -> bool:
        """The holder gives the item up as failed (resumable); False if it was not ours."""
        return bool(self._give_up(_items.c.id == claim.item.pk, claim.owner, error_text))

    def withdraw(self, claim: Claim, submission: Submission) -> bool:
        """An intent whose call provably never left the machine (stopped before sending).

        The intent is removed and its attempt given back, so a later run submits the item
        normally instead of treating it as an unknown outcome. False (nothing removed) if the
        item is no longer held by `claim.owner`: another holder took it over and may have
        sent this very intent.
        """
        with tx.write(self.engine) as conn:
            return self._withdraw_in(conn, claim, submission)

    @staticmethod
    def _withdraw_in(conn: Connection, claim: Claim, submission: Submission) -> bool:
        # Only the item's current holder withdraws: a holder frozen past its lease, whose
        # item was taken over meanwhile, must not delete an intent the new holder may have
        # sent (its reconcile resends the same create). The item row is locked first, so a
        # takeover waits for this transaction or this one sees the takeover.
        if not _held(conn, claim):
            return False
        removed = conn.execute(
            delete(_subs).where(
                _subs.c.id == submission.pk,
                _subs.c.state == SubmissionState.INTENT,
                ~exists().where(_costs.c.submission_pk == submission.pk),
            )
        ).rowcount
        if removed:
            conn.execute(
                update(_items)
                .where(
                    _items.c.id == claim.item.pk,
                    _items.c.claim_owner == claim.owner,
                    _items.c.attempts == submission.attempt,
                )
                .values(attempts=_items.c.attempts - 1)
            )
        return bool(removed)

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
            for item_pk in sorted(item_pks):  # ascending, as `tx.in_id_order` locks
                row = conn.execute(
                    select(_items.c.id, _items.c.attempts)
                    .where(_items.c.id == item_pk, _items.c.claim_owner == owner)
                    .with_for_update(key_share=True)
                ).first()
                if row is None:
                    continue
                removed = conn.execute(
                    delete(_subs).where(
                        _subs.c.item_pk == item_pk,
                        _subs.c.state == SubmissionState.INTENT,
                        _subs.c.attempt == row.attempts,
                        _subs.c.created_at >= since,
                        ~exists().where(_costs.c.submission_pk == _subs.c.id),
                    )
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
            if unstarted and claim.action == "submit" and claim.submission is not None:
                withdrawn = self._withdraw_in(conn, claim, claim.submission)
            _give_up_in(conn, _items.c.id == claim.item.pk, claim.owner, error_text)
        return withdrawn

    def release_all(self, owner: str, error_text: str) -> int:
        """Give up every item `owner` still holds (interrupt, cancellation, crash path)."""
        return self._give_up(true(), owner, error_text)

    def _give_up(self, which: ColumnElement[bool], owner: str, error_text: str) -> int:
        with tx.write(self.engine) as conn:
            return _give_up_in(conn, which, owner, error_text)

    # ------------------------------------------------------------------ the ledger
    @idempotent
    def accept(self, submission_pk: int, remote_ref: str) -> bool:
        """Record the provider's job for an intent (or a reconciled unknown).

        Never guarded by the claim: a job that exists is recorded whoever learns of it.
        False when the remote reference already belongs to another submission (a lookup
        that answered with another item's job) or the submission has another outcome.
        """
        try:
            with tx.write(self.engine) as conn:
                moved = hot.rowcount(
                    conn,
                    _ACCEPT,
                    {"b_sub": submission_pk, "b_remote": remote_ref, "b_now": utcnow()},
                )
                if moved:
                    return True
                current = conn.execute(
                    select(_subs.c.state, _subs.c.remote_ref).where(_subs.c.id == submission_pk)
                ).first()
                return current is not None and bool(
                    current.state == SubmissionState.ACCEPTED and current.remote_ref == remote_ref
                )
        except IntegrityError:
            return False

    @idempotent
    def mark_unknown(self, submission_pk: int, reason: str) -> None:
        with tx.write(self.engine) as conn:
            conn.execute(
                update(_subs)
                .where(_subs.c.id == submission_pk, _subs.c.state.in_(_UNSETTLED))
                .values(state=SubmissionState.UNKNOWN, error_text=reason[:2000])
            )

    def refuse(self, claim: Claim, submission_pk: int, reason: str) -> bool:
        """The holder's call provably created nothing (the provider refused it), or an operator
        abandons the holder's unknown (``--force-resubmit``): the submission is closed failed.

        Only while `claim.owner` holds the item and the submission is unsettled (intent or
        unknown). A holder frozen past its lease whose item was taken over must not close a
        submission the new holder resent and the provider accepted: the next run would pay
        again. False (nothing written) otherwise; the new holder settles it.
        """
        now = utcnow()
        with tx.write(self.engine) as conn:
            if not _held(conn, claim):
                return False
            moved = conn.execute(
                update(_subs)
                .where(_subs.c.id == submission_pk, _subs.c.state.in_(_UNSETTLED))
                .values(state=SubmissionState.FAILED, error_text=reason[:2000], finished_at=now)
            ).rowcount
            return bool(moved)

    def close_failed(
        self,
        submission_pk: int,
        reason: str,
        *,
        episode_pk: int | None = None,
        cost_minor: int = 0,
        currency: str = "USD",
    ) -> bool:
        """The provider reports the accepted job failed (a fact whoever holds the item).

        A failed job the provider billed (`cost_minor` > 0) gets its cost entry in the same
        transaction: the ledger shows what the provider charged.
        """
        now = utcnow()
        with tx.write(self.engine) as conn:
            moved = conn.execute(
                update(_subs)
                .where(_subs.c.id == submission_pk, _subs.c.state.in_(_OPEN))
                .values(state=SubmissionState.FAILED, error_text=reason[:2000], finished_at=now)
            ).rowcount
            if moved and cost_minor > 0 and episode_pk is not None:
                _record_cost(conn, episode_pk, submission_pk, cost_minor, currency, now)
            return bool(moved)

    @idempotent
    def complete(
        self,
        claim: Claim,
        submission_pk: int,
        episode_pk: int,
        output_path: str,
        sha256: str,
        cost_minor: int,
        currency: str,
    ) -> bool:
        """Outcome, cost and item completion in one guarded transaction.

        False (and nothing written) when the claim was taken over or the submission already
        has an outcome: the new holder finishes the item, and the cost is counted once.
        True also when exactly this completion is already committed (the same holder, image
        and submission): a retry after a COMMIT whose reply was lost answers what happened.
        """
        now = utcnow()
        try:
            with tx.write(self.engine) as conn:
                item_moved = hot.rowcount(
                    conn,
                    _COMPLETE_ITEM,
                    {
                        "b_item": claim.item.pk,
                        "b_owner": claim.owner,
                        "b_path": output_path,
                        "b_sha": sha256,
                        "b_now": now,
                    },
                )
                sub_moved = hot.rowcount(conn, _SUCCEED_SUB, {"b_sub": submission_pk, "b_now": now})
                if not (item_moved and sub_moved):
                    raise _Lost()
                _record_cost(conn, episode_pk, submission_pk, cost_minor, currency, now)
        except _Lost:
            return self._completed_by(claim, submission_pk, sha256)
        return True

    def _completed_by(self, claim: Claim, submission_pk: int, sha256: str) -> bool:
        """This holder's completion of the item with this image and submission is committed
        (with its cost entry)."""
        with tx.read(self.engine) as conn:
            return (
                conn.execute(
                    select(_items.c.id).where(
                        _items.c.id == claim.item.pk,
                        _items.c.state == ItemState.COMPLETED,
                        _items.c.claim_owner == claim.owner,
                        _items.c.output_sha256 == sha256,
                        exists().where(
                            _subs.c.id == submission_pk,
                            _subs.c.item_pk == claim.item.pk,
                            _subs.c.state == SubmissionState.SUCCEEDED,
                        ),
                        exists().where(_costs.c.submission_pk == submission_pk),
                    )
                ).first()
                is not None
            )


def _in_flight(
    conn: Connection, profile: str, item_pk: int, now: datetime, max_job_s: float | None
) -> int:
    """The slots of `profile` taken by other items than this one (see `ClaimStore.claim`)."""
    params: dict[str, Any] = {"b_profile": profile, "b_now": now, "b_item": item_pk}
    if max_job_s is None:
        return int(hot.scalar(conn, _IN_FLIGHT, params))
    params["b_since"] = now - timedelta(seconds=max_job_s)
    return int(hot.scalar(conn, _IN_FLIGHT_WITH_JOBS, params))


def _holds_params(claim: Claim) -> dict[str, Any]:
    return {
        "b_item": claim.item.pk,
        "b_owner": claim.owner,
        "b_now": utcnow(),
        "b_run": claim.run_id,
    }


def _intend(conn: Connection, item: Item, run_id: str, profile: str, *, forced: bool) -> Submission:
    """Count the attempt and commit the intent of a paid call (caller holds the claim)."""
    attempt = conn.execute(_COUNT_ATTEMPT, {"b_item": item.pk}).scalar_one()
    return _insert_intent(conn, item, run_id, profile, attempt, utcnow(), forced=forced)


def _insert_intent(
    conn: Connection,
    item: Item,
    run_id: str,
    profile: str,
    attempt: int,
    now: datetime,
    *,
    forced: bool,
) -> Submission:
    """The intent of paid call number `attempt` (already counted on the item), under this
    installation's reference ``{installation id}-{item key}-{attempt}``."""
    found = hot.fetch_one(
        conn,
        _INSERT_INTENT,
        {
            "b_item": item.pk,
            "b_run": run_id,
            "b_attempt": attempt,
            "b_ref": f"{item.idempotency_key}-{attempt}",
            "b_profile": profile,
            "b_forced": forced,
            "b_now": now,
        },
    )
    assert found is not None  # an INSERT ... RETURNING answers its row
    pk, client_reference = found
    return Submission(pk, item.pk, attempt, client_reference, SubmissionState.INTENT, None)


def _submission(row: Any) -> Submission:
    return Submission(
        row.id, row.item_pk, row.attempt, row.client_reference, row.state, row.remote_ref
    )


def _record_cost(
    conn: Connection,
    episode_pk: int,
    submission_pk: int,
    amount_minor: int,
    currency: str,
    now: datetime,
) -> None:
    """The ledger's cost entry of a submission (minor units), in the caller's transaction."""
    hot.rowcount(
        conn,
        _INSERT_COST,
        {
            "b_episode": episode_pk,
            "b_sub": submission_pk,
            "b_amount": amount_minor,
            "b_currency": currency,
            "b_now": now,
        },
    )


def _give_up_in(conn: Connection, which: ColumnElement[bool], owner: str, error_text: str) -> int:
    """`owner`'s running items among `which` become failed (resumable), in `conn`'s
    transaction; returns how many."""
    given_up = and_(which, _items.c.claim_owner == owner, _items.c.state == ItemState.RUNNING)
    return int(
        conn.execute(
            update(_items)
            .where(tx.in_id_order(_items, given_up), given_up)
            .values(
                state=ItemState.FAILED,
                error_text=error_text[:2000],
                finished_at=utcnow(),
                lease_expires_at=None,
            )
        ).rowcount
    )
