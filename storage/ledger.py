"""The spend ledger: each paid call's submission and its cost, and what was spent.

A submission moves ``intent`` (committed before the call, in the claim's transaction: see
`storage.claims`) -> ``accepted`` (the provider's job recorded) -> ``succeeded`` with its cost
entry, or ``failed``; ``unknown`` when the call may or may not have been accepted (never
resubmitted). A write made for the holder of a claim is guarded by its ownership and answers
False when another holder took the item over; facts about a job the provider reports
(accepted, failed) are recorded whoever learns of them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, Select, Table, exists, func, or_, select, update
from sqlalchemy.exc import IntegrityError

from episodic.core.media import StoredMedia
from episodic.core.pricing import Charge, Reservation
from episodic.core.records import EpisodeImage
from episodic.core.runs import Claim, Item, Submission
from episodic.core.states import ItemState, SubmissionState
from episodic.storage import dbapi, statements, tx
from episodic.storage.base import utcnow
from episodic.storage.models import CostEntryRow, ItemRow, LostOutputRow, RunItemRow, SubmissionRow
from episodic.storage.tx import idempotent, retry_outages

_items: Table = ItemRow.__table__  # type: ignore[assignment]
_subs: Table = SubmissionRow.__table__  # type: ignore[assignment]
_costs: Table = CostEntryRow.__table__  # type: ignore[assignment]
_members: Table = RunItemRow.__table__  # type: ignore[assignment]
_lost: Table = LostOutputRow.__table__  # type: ignore[assignment]


def held(conn: Connection, claim: Claim) -> bool:
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
class LedgerStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @idempotent
    def accept(self, submission_pk: int, remote_ref: str) -> bool:
        """Record the provider's job for an intent (or a reconciled unknown).

        Never guarded by the claim: a job that exists is recorded whoever learns of it.
        False when the remote reference already belongs to another submission (a lookup
        that answered with another item's job) or the submission has another outcome.
        """
        try:
            with tx.write(self.engine) as conn:
                moved = dbapi.rowcount(
                    conn,
                    statements.ACCEPT,
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

    def recorded_elsewhere(self, remote_ref: str, submission_pk: int) -> bool:
        """Whether the ledger records the provider's job `remote_ref` for a submission other
        than `submission_pk` (another item's, another episode's, or an earlier attempt's):
        a lookup or an operator's adoption never takes it for this one."""
        with tx.read(self.engine) as conn:
            return (
                conn.execute(
                    select(_subs.c.id)
                    .where(_subs.c.remote_ref == remote_ref, _subs.c.id != submission_pk)
                    .limit(1)
                ).first()
                is not None
            )

    @idempotent
    def mark_unknown(self, submission_pk: int, reason: str) -> None:
        with tx.write(self.engine) as conn:
            conn.execute(statements.mark_unknown(submission_pk, reason))

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
            if not held(conn, claim):
                return False
            moved = conn.execute(statements.refuse(submission_pk, reason, now)).rowcount
            return bool(moved)

    def close_failed(
        self,
        submission_pk: int,
        reason: str,
        *,
        episode_pk: int | None = None,
        charge: Charge | None = None,
    ) -> bool:
        """The provider reports the accepted job failed (a fact whoever holds the item).

        A failed job the provider billed (`charge`, None: not billed) gets its cost entry
        in the same transaction: the ledger shows what the provider charged.
        """
        now = utcnow()
        with tx.write(self.engine) as conn:
            moved = conn.execute(statements.close_failed(submission_pk, reason, now)).rowcount
            if moved and charge is not None and episode_pk is not None:
                _record_cost(conn, episode_pk, submission_pk, charge, now)
            return bool(moved)

    @idempotent
    def complete(
        self,
        claim: Claim,
        submission_pk: int,
        episode_pk: int,
        image: StoredMedia,
        charge: Charge,
    ) -> bool:
        """Outcome, cost and item completion in one guarded transaction.

        `image` is what the media store verifiably holds (`MediaStore.put_image`): the item
        records its key, sha256, size and media type, never a machine path. The caller
        stores and verifies the bytes first; a completion is never written for an image the
        store does not hold.

        False (and nothing written) when the claim was taken over or the submission already
        has an outcome: the new holder finishes the item, and the cost is counted once.
        True also when exactly this completion is already committed (the same holder, image
        and submission): a retry after a COMMIT whose reply was lost answers what happened.
        """
        now = utcnow()
        try:
            with tx.write(self.engine) as conn:
                completion = {
                    "b_item": claim.item.pk,
                    "b_owner": claim.owner,
                    "b_key": image.key,
                    "b_sha": image.sha256,
                    "b_size": image.size,
                    "b_type": image.media_type,
                    "b_now": now,
                }
                if conn.dialect.name == "postgresql":  # one round trip: all three moves
                    made = dbapi.fetch_one(
                        conn,
                        statements.COMPLETE_AND_CHARGE,
                        {**completion, "b_sub": submission_pk, **_cost_params(episode_pk, charge)},
                    )
                    if made is None:
                        raise _Lost()
                else:
                    item_moved = dbapi.rowcount(conn, statements.COMPLETE_ITEM, completion)
                    sub_moved = dbapi.rowcount(
                        conn, statements.SUCCEED, {"b_sub": submission_pk, "b_now": now}
                    )
                    if not (item_moved and sub_moved):
                        raise _Lost()
                    _record_cost(conn, episode_pk, submission_pk, charge, now)
        except _Lost:
            return self._completed_by(claim, submission_pk, image.sha256)
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

    def withdraw(self, claim: Claim, submission: Submission) -> bool:
        """An intent whose call provably never left the machine (stopped before sending).

        The intent is removed and its attempt given back, so a later run submits the item
        normally instead of treating it as an unknown outcome. False (nothing removed) if the
        item is no longer held by `claim.owner`: another holder took it over and may have
        sent this very intent.
        """
        with tx.write(self.engine) as conn:
            return withdraw_in(conn, claim, submission)

    def episode_spend(self, episode_pk: int) -> tuple[int, dict[str, int]]:
        """(paid submissions, cost in micro-units per currency) of the episode over every
        run: what the ledger says the provider billed, not what the last run did. Costs in
        different currencies (a re-plan onto another profile) are never summed."""
        with tx.read(self.engine) as conn:
            paid = conn.execute(
                select(func.count())
                .select_from(_subs)
                .join(_items, _items.c.id == _subs.c.item_pk)
                .where(_items.c.episode_pk == episode_pk)
            ).scalar_one()
            costs = conn.execute(
                select(_costs.c.currency, func.sum(_costs.c.amount_micros))
                .where(_costs.c.episode_pk == episode_pk)
                .group_by(_costs.c.currency)
            ).all()
        return int(paid), {str(currency): int(total) for currency, total in costs}

    def episode_open_jobs(self, episode_pk: int) -> list[tuple[int, str]]:
        """The episode's jobs the provider accepted and nobody collected yet (still running,
        or cancelled, at the provider): (submission pk, provider profile), oldest first."""
        with tx.read(self.engine) as conn:
            rows = conn.execute(
                select(_subs.c.id, _subs.c.provider_profile)
                .join(_items, _items.c.id == _subs.c.item_pk)
                .where(
                    _items.c.episode_pk == episode_pk,
                    _subs.c.state == SubmissionState.ACCEPTED,
                    _subs.c.remote_ref.is_not(None),
                )
                .order_by(_subs.c.id)
            ).all()
        return [(int(r.id), str(r.provider_profile)) for r in rows]

    def accepted_jobs(self, run_id: str) -> list[tuple[int, str, str]]:
        """The jobs the provider accepted for the run's items and nobody collected yet, made
        by this run or by another (a job a cancelled run kept for this one): (submission pk,
        remote reference, provider profile), oldest first."""
        members = select(_members.c.item_pk).where(_members.c.run_id == run_id)
        with tx.read(self.engine) as conn:
            rows = conn.execute(
                select(_subs.c.id, _subs.c.remote_ref, _subs.c.provider_profile)
                .where(
                    or_(_subs.c.run_id == run_id, _subs.c.item_pk.in_(members)),
                    _subs.c.state == SubmissionState.ACCEPTED,
                    _subs.c.remote_ref.is_not(None),
                )
                .order_by(_subs.c.id)
            ).all()
        return [(int(r.id), str(r.remote_ref), str(r.provider_profile)) for r in rows]


def withdraw_in(conn: Connection, claim: Claim, submission: Submission) -> bool:
    """`LedgerStore.withdraw` in the caller's transaction: True if the intent was removed."""
    # Only the item's current holder withdraws: a holder frozen past its lease, whose
    # item was taken over meanwhile, must not delete an intent the new holder may have
    # sent (its reconcile resends the same create). The item row is locked first, so a
    # takeover waits for this transaction or this one sees the takeover.
    if not held(conn, claim):
        return False
    removed = conn.execute(statements.withdraw_intent(submission.pk)).rowcount
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


def insert_intent(
    conn: Connection,
    item: Item,
    run_id: str,
    profile: str,
    attempt: int,
    now: datetime,
    *,
    forced: bool,
    reserve: Reservation,
) -> Submission:
    """The intent of paid call number `attempt` (already counted on the item), under this
    installation's reference ``{installation id}-{item key}-{attempt}``, reserved at
    `reserve` (the price's estimate) until it settles."""
    found = dbapi.fetch_one(
        conn,
        statements.INSERT_INTENT,
        {
            "b_item": item.pk,
            "b_run": run_id,
            "b_attempt": attempt,
            "b_ref": f"{item.idempotency_key}-{attempt}",
            "b_profile": profile,
            "b_forced": forced,
            "b_now": now,
            "b_reserve": reserve.micros,
            "b_currency": reserve.currency,
        },
    )
    assert found is not None  # an INSERT ... RETURNING answers its row
    pk, client_reference = found
    return Submission(pk, item.pk, attempt, client_reference, SubmissionState.INTENT, None)


def submission_of(row: Any) -> Submission:
    return Submission(
        row.id, row.item_pk, row.attempt, row.client_reference, row.state, row.remote_ref
    )


def _record_cost(
    conn: Connection,
    episode_pk: int,
    submission_pk: int,
    charge: Charge,
    now: datetime,
) -> None:
    """The ledger's cost entry of a submission (micro-units, with the basis, the measured
    quantity and the unit price it follows from), in the caller's transaction."""
    dbapi.rowcount(
        conn,
        statements.INSERT_COST,
        {"b_sub": submission_pk, "b_now": now, **_cost_params(episode_pk, charge)},
    )


def _cost_params(episode_pk: int, charge: Charge) -> dict[str, Any]:
    """`statements.INSERT_COST`'s parameters for `charge`, but the submission and the time."""
    return {
        "b_episode": episode_pk,
        "b_amount": charge.amount_micros,
        "b_currency": charge.currency,
        "b_basis": charge.basis,
        "b_quantity": charge.quantity,
        "b_unit": charge.unit_micros,
    }


def completed_images(episode_pk: int, *columns: Any) -> Select[Any]:
    """`columns` of the episode's completed items, each joined to its succeeded paid call
    (``submissions``) and that call's cost (``cost_entries``), in playlist order (position,
    part, candidate): the one read of what was bought, for approval and `media restore`. A
    succeeded call whose output was lost (`lost_outputs`: bought again) is not its call."""
    return (
        select(*columns)
        .select_from(_items)
        .join(
            _subs,
            (_subs.c.item_pk == _items.c.id)
            & (_subs.c.state == SubmissionState.SUCCEEDED)
            & ~exists().where(_lost.c.submission_pk == _subs.c.id),
        )
        .join(_costs, _costs.c.submission_pk == _subs.c.id)
        .where(_items.c.episode_pk == episode_pk, _items.c.state == ItemState.COMPLETED)
        .order_by(_items.c.position, _items.c.part, _items.c.candidate)
    )


def completed_outputs(engine: Engine, episode_pk: int) -> list[EpisodeImage]:
    """The episode's completed images, each with the remote ref and cost of its paid call,
    in playlist order (position, part, candidate)."""
    with tx.read(engine) as conn:
        rows = conn.execute(
            completed_images(
                episode_pk,
                _items.c.idempotency_key,
                _items.c.video_id,
                _items.c.part,
                _items.c.candidate,
                _items.c.position,
                _items.c.output_key,
                _items.c.output_sha256,
                _items.c.output_size,
                _items.c.output_media_type,
                _items.c.output_path,
                _subs.c.remote_ref,
                _costs.c.amount_micros,
                _costs.c.currency,
            )
        ).all()
    return [
        EpisodeImage(
            idempotency_key=row.idempotency_key,
            video_id=row.video_id,
            part=row.part,
            candidate=row.candidate,
            position=row.position,
            key=row.output_key,
            sha256=row.output_sha256,
            size=row.output_size,
            media_type=row.output_media_type,
            legacy_path=row.output_path,
            remote_ref=row.remote_ref,
            cost_micros=row.amount_micros,
            currency=row.currency,
        )
        for row in rows
    ]


def ledger_totals(engine: Engine) -> tuple[int, dict[str, int]]:
    """What the whole ledger holds: (paid calls it records: every submission, whatever its
    outcome, as `episode_spend` counts them; cost in micro-units per currency). (0, {}) for a
    database without the schema. What `episodic state remove` weighs before removing it."""
    from episodic.storage.schema import current_revision

    if current_revision(engine) is None:
        return 0, {}
    with tx.read(engine) as conn:
        calls = conn.execute(select(func.count()).select_from(_subs)).scalar_one()
        spent = conn.execute(
            select(_costs.c.currency, func.sum(_costs.c.amount_micros)).group_by(_costs.c.currency)
        ).all()
    return int(calls), {str(currency): int(amount) for currency, amount in spent}


record_cost = (
    _record_cost  # (the one way a cost entry is written: `episodic.storage.provider_outputs`)
)
