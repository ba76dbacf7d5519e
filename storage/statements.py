"""Every statement that moves a state, named, each labelled with the transition it makes.

A label is the comment line right above a statement::

    # <machine>: <source>, <source> -> <target>

with `machine` one of run, item, submission, episode; ``(new)`` as the source of an insert;
``(deleted)`` as the target of a delete; ``*`` for a statement whose sources are taken from
`episodic.core.states` for its target (`sources_of`); and a qualifier in parentheses after a state
(``running(expired)``) that the guard adds. `tests/unit/test_statements.py` checks each
label against `episodic.core.states`, each move of its tables against the labels, and that no other
storage module moves a state: the tables are what these statements do.

Each statement is guarded: its ``WHERE`` repeats the source states (and the claim, lease or
run it depends on), and the caller checks the rowcount, since reading a state in Python and
then writing it is a race under Postgres READ COMMITTED. The paid path's statements are
hand-written and run on the bare driver (`episodic.storage.dbapi`: through SQLAlchemy Core each cost
about ten times the driver's own time, bench/ledger.py); the others are SQLAlchemy Core,
built per call with the values they set. The rooms run them in their transactions, under
the lock order of `episodic.storage.locks`. `pipeline/check.py` and the reliability oracle keep
their own encodings of these rules on purpose (docs/architecture.md, "Two notes")."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Delete,
    Table,
    Update,
    and_,
    delete,
    exists,
    func,
    literal,
    select,
    text,
    update,
)

from episodic.core.errors import InvalidTransition
from episodic.core.runs import REPLANNED, STORE_STOPPED
from episodic.core.states import (
    EpisodeState,
    ItemState,
    RunState,
    SubmissionState,
    sources_of,
)
from episodic.storage import models
from episodic.storage.dbapi import DriverSQL
from episodic.storage.locks import in_id_order
from episodic.storage.predicates import OPEN, UNSETTLED, UNSETTLED_SQL

_episodes: Table = models.EpisodeRow.__table__  # type: ignore[assignment]
_plans: Table = models.EpisodePlanRow.__table__  # type: ignore[assignment]
_runs: Table = models.RunRow.__table__  # type: ignore[assignment]
_items: Table = models.ItemRow.__table__  # type: ignore[assignment]
_members: Table = models.RunItemRow.__table__  # type: ignore[assignment]
_subs: Table = models.SubmissionRow.__table__  # type: ignore[assignment]
_costs: Table = models.CostEntryRow.__table__  # type: ignore[assignment]

# ------------------------------------------------------------------ runs


# run: * -> *
def move_run(run_id: str, target: RunState, values: dict[str, Any], keep: bool = False) -> Update:
    """The run moves to `target` from any state `core.states` allows (`RunStore.transition_run`)."""
    guard = [_runs.c.id == run_id, _runs.c.state.in_(sources_of("run", target))]
    if keep:  # not a run paused at a media store failure: that one waits for a resume
        guard.append(func.coalesce(_runs.c.error_text, "").not_like(f"{STORE_STOPPED}%"))
    return update(_runs).where(*guard).values({**values, "state": target})


# run: pending -> cancelled
def abandon_pending_run(run_id: str, now: datetime, reason: str) -> Update:
    """A run that never started is cancelled (its creator was interrupted)."""
    return (
        update(_runs)
        .where(_runs.c.id == run_id, _runs.c.state == RunState.PENDING)
        .values(state=RunState.CANCELLED, finished_at=now, error_text=reason)
    )


# run: running -> cancelled
CANCEL_REPLANNED = DriverSQL(
    f"UPDATE runs SET state = 'cancelled', error_text = '{REPLANNED}', finished_at = :b_now "
    "WHERE id = :b_run AND state = 'running'"
)
"""A running run of a re-planned episode is cancelled by the claim that finds it so."""

# ------------------------------------------------------------------ items


# item: pending -> cancelled
def cancel_orphaned(orphaned: ColumnElement[bool], now: datetime) -> Update:
    """The pending items among `orphaned` (no live run includes them) are cancelled, locked
    in id order."""
    return (
        update(_items)
        .where(in_id_order(_items, orphaned), _items.c.state == ItemState.PENDING)
        .values(state=ItemState.CANCELLED, finished_at=now)
    )


# item: cancelled -> pending
def restart_cancelled(run_id: str) -> Update:
    """A cancelled item a new run includes starts over as pending."""
    restarted = and_(
        _items.c.id.in_(select(_members.c.item_pk).where(_members.c.run_id == run_id)),
        _items.c.state == ItemState.CANCELLED,
    )
    return (
        update(_items)
        .where(in_id_order(_items, restarted), _items.c.state == ItemState.CANCELLED)
        .values(state=ItemState.PENDING)
    )


_TAKE = (
    "UPDATE items SET state = 'running', error_text = NULL, claim_owner = :b_owner, "
    "claim_run_id = :b_run, claim_profile = :b_profile, claim_token = :b_token, "
    "lease_expires_at = :b_lease, started_at = :b_now, finished_at = NULL"
)
# The claim decides, the item row locked, that it may take the item (`ClaimStore.claim`);
# the statement repeats the rule: not completed, and not held by another owner's live lease
# (`predicates.LIVE_CLAIM_SQL`'s negation, or the claimer's own), so a wrong decision moves
# nothing and the claim raises.
_TAKE_GUARD = (
    "WHERE id = :b_item AND (state IN ('pending', 'failed', 'cancelled') OR (state = 'running' "
    "AND (lease_expires_at IS NULL OR lease_expires_at <= :b_now OR claim_owner = :b_owner)))"
)
# item: pending, failed, cancelled, running(expired or its own) -> running
TAKE_ITEM = DriverSQL(f"{_TAKE} {_TAKE_GUARD}")
# The same for a new paid call: the attempt is counted in the same statement.
# item: pending, failed, cancelled, running(expired or its own) -> running
TAKE_ITEM_AND_COUNT = DriverSQL(
    f"{_TAKE}, attempts = attempts + 1 {_TAKE_GUARD} RETURNING attempts"
)

# PostgreSQL, where each statement is a round trip: `TAKE_ITEM_AND_COUNT` and
# `INSERT_INTENT` (below) in one, for every new paid call of a claim's batch at once (SQLite
# runs the two per item). The batch is three arrays of one length: the items, their fresh
# claim tokens and what each call is reserved at. An item the take's guard refuses gets no
# intent and no row back: the claim raises. The batch's rows are locked already, in id order
# (`ClaimStore`), so the join order of this update takes no new lock.
TAKE_AND_INTEND = DriverSQL(
    "WITH asked AS (SELECT * FROM unnest(CAST(:b_items AS bigint[]), CAST(:b_tokens AS "
    "text[]), CAST(:b_reserves AS bigint[])) AS a(item, token, reserve)), "
    f"taken AS ({_TAKE.replace(':b_token', 'asked.token')}, attempts = attempts + 1 FROM asked "
    f"{_TAKE_GUARD.replace(':b_item', 'asked.item')} RETURNING id, attempts, idempotency_key, "
    "asked.reserve) "
    "INSERT INTO submissions (item_pk, run_id, attempt, client_reference, provider_profile, "
    "state, forced, created_at, reserved_micros, currency) SELECT taken.id, :b_run, "
    "taken.attempts, (SELECT id FROM installation WHERE singleton = 1) || '-' || "
    "taken.idempotency_key || '-' || taken.attempts, :b_profile, 'intent', false, :b_now, "
    "taken.reserve, :b_currency FROM taken RETURNING item_pk, id, attempt, client_reference"
)

# item: running -> completed
COMPLETE_ITEM = DriverSQL(
    "UPDATE items SET state = 'completed', error_text = NULL, output_key = :b_key, "
    "output_sha256 = :b_sha, output_size = :b_size, output_media_type = :b_type, "
    "output_path = NULL, lease_expires_at = NULL, finished_at = :b_now "
    "WHERE id = :b_item AND claim_owner = :b_owner AND state = 'running'"
)

# `media restore --buy-again`: a lost image is bought again (`lost_outputs` keeps the loss).
# item: completed -> pending
LOSE_OUTPUT = DriverSQL(
    "UPDATE items SET state = 'pending', error_text = :b_reason, output_key = NULL, "
    "output_sha256 = NULL, output_size = NULL, output_media_type = NULL, output_path = NULL "
    "WHERE id = :b_item AND state = 'completed' AND output_sha256 = :b_sha"
)


# `media restore --buy-again`, confirmed: an output gone at the provider is bought again
# (`episodic.storage.provider_outputs`; `lost_outputs` keeps the loss).
# item: failed -> pending
BUY_GONE_AGAIN = DriverSQL(
    "UPDATE items SET state = 'pending', error_text = :b_reason WHERE id = :b_item "
    "AND state = 'failed'"
)


# item: running -> failed
def give_up_items(which: ColumnElement[bool], owner: str, error_text: str, now: datetime) -> Update:
    """`owner`'s running items among `which` become failed (resumable), locked in id order."""
    given_up = and_(which, _items.c.claim_owner == owner, _items.c.state == ItemState.RUNNING)
    return (
        update(_items)
        .where(in_id_order(_items, given_up), given_up)
        .values(
            state=ItemState.FAILED,
            error_text=error_text[:2000],
            finished_at=now,
            lease_expires_at=None,
        )
    )


# Nothing was sent for the item and nothing failed (a throttle paused its run): to buy.
# item: running -> pending
PUT_BACK_ITEM = DriverSQL(
    "UPDATE items SET state = 'pending', error_text = :b_note, lease_expires_at = NULL, "
    "finished_at = NULL WHERE id = :b_item AND claim_owner = :b_owner AND state = 'running'"
)

# ------------------------------------------------------------------ submissions

# A new submission's client reference: this installation's id, the item's key and the
# attempt (Python twin: `episodic.storage.installation.reference`), built in the INSERT from the
# database's own row: no process caches the id, so a `renew` takes effect at once everywhere.
REFERENCE_SQL = "(SELECT id FROM installation WHERE singleton = 1) || '-' || :b_ref"

# submission: (new) -> intent
INSERT_INTENT = DriverSQL(
    "INSERT INTO submissions (item_pk, run_id, attempt, client_reference, provider_profile, "
    "state, forced, created_at, reserved_micros, currency) VALUES (:b_item, :b_run, "
    f":b_attempt, {REFERENCE_SQL}, :b_profile, 'intent', :b_forced, :b_now, :b_reserve, "
    ":b_currency) "
    "RETURNING id, client_reference"
)

# `db installation --renew`: a copy's inherited open submissions are the original's jobs
# (their references carry its id), never to be collected, reconciled or cancelled here: they
# close as failed with no cost; the copy's next run buys its own (a new attempt).
# submission: intent, accepted, unknown -> failed
DISOWN = text(
    "UPDATE submissions SET state = 'failed', error_text = :b_why, finished_at = :b_now "
    "WHERE state IN ('intent', 'accepted', 'unknown') AND client_reference LIKE :b_prefix"
)

# submission: intent, unknown -> accepted
ACCEPT = DriverSQL(
    "UPDATE submissions SET state = 'accepted', remote_ref = :b_remote, error_text = NULL, "
    f"accepted_at = :b_now WHERE id = :b_sub AND {UNSETTLED_SQL}"
)

# submission: accepted -> succeeded
SUCCEED = DriverSQL(
    "UPDATE submissions SET state = 'succeeded', finished_at = :b_now "
    "WHERE id = :b_sub AND state = 'accepted'"
)

# A paid call's cost (no state move: the ledger's entry of what a succeeded call cost).
INSERT_COST = DriverSQL(
    "INSERT INTO cost_entries (episode_pk, submission_pk, amount_micros, currency, basis, "
    "quantity, unit_price_micros, recorded_at) "
    "VALUES (:b_episode, :b_sub, :b_amount, :b_currency, :b_basis, :b_quantity, :b_unit, :b_now)"
)

# PostgreSQL, where each statement is a round trip: `COMPLETE_ITEM`, `SUCCEED` and
# `INSERT_COST` in one, for a completion (SQLite runs the three). The submission moves only
# when the item did and the cost is entered only when the submission moved, so a row comes
# back only when all three were made; when none comes back the caller rolls back.
COMPLETE_AND_CHARGE = DriverSQL(
    f"WITH done AS ({COMPLETE_ITEM.sqlite} RETURNING id), "
    f"paid AS ({SUCCEED.sqlite} AND EXISTS (SELECT 1 FROM done) RETURNING id) "
    + INSERT_COST.sqlite.replace(
        "VALUES (:b_episode, :b_sub,", "SELECT :b_episode, paid.id,"
    ).removesuffix(")")
    + " FROM paid RETURNING id"
)


# submission: intent, unknown -> unknown
def mark_unknown(submission_pk: int, reason: str) -> Update:
    """The call's outcome is not known (a reply lost, a lookup that found nothing)."""
    return (
        update(_subs)
        .where(_subs.c.id == submission_pk, _subs.c.state.in_(UNSETTLED))
        .values(state=SubmissionState.UNKNOWN, error_text=reason[:2000])
    )


# submission: intent, unknown -> failed
def refuse(submission_pk: int, reason: str, now: datetime) -> Update:
    """The call provably created nothing (the provider refused it, or an operator abandons an
    unknown)."""
    return (
        update(_subs)
        .where(_subs.c.id == submission_pk, _subs.c.state.in_(UNSETTLED))
        .values(state=SubmissionState.FAILED, error_text=reason[:2000], finished_at=now)
    )


# submission: intent, accepted, unknown -> failed
def close_failed(submission_pk: int, reason: str, now: datetime) -> Update:
    """The provider reports the job failed."""
    return (
        update(_subs)
        .where(_subs.c.id == submission_pk, _subs.c.state.in_(OPEN))
        .values(state=SubmissionState.FAILED, error_text=reason[:2000], finished_at=now)
    )


# submission: intent -> (deleted)
def withdraw_intent(submission_pk: int) -> Delete:
    """An intent whose call provably never left the machine, and that has no cost."""
    return delete(_subs).where(
        _subs.c.id == submission_pk,
        _subs.c.state == SubmissionState.INTENT,
        ~exists().where(_costs.c.submission_pk == submission_pk),
    )


# submission: intent -> (deleted)
def withdraw_unreceived(item_pk: int, attempt: int, since: datetime) -> Delete:
    """The item's intent of paid call `attempt`, made at `since` or later (a claim whose reply
    was lost), that has no cost."""
    return delete(_subs).where(
        _subs.c.item_pk == item_pk,
        _subs.c.state == SubmissionState.INTENT,
        _subs.c.attempt == attempt,
        _subs.c.created_at >= since,
        ~exists().where(_costs.c.submission_pk == _subs.c.id),
    )


# ------------------------------------------------------------------ episodes


# episode: * -> *
def set_episode_state(
    episode_pk: int, allowed: Sequence[str], target: EpisodeState, now: datetime
) -> Update:
    """The episode moves to `target` from one of `allowed` (`sources_of` for it, or the one
    source a caller names). `InvalidTransition` when `allowed` names a state from which
    `core.states` does not allow `target`."""
    if wrong := sorted(set(allowed) - set(sources_of("episode", target))):
        raise InvalidTransition(f"episode cannot go from {', '.join(wrong)} to {target}")
    return (
        update(_episodes)
        .where(_episodes.c.id == episode_pk, _episodes.c.state.in_(allowed))
        .values(state=target, updated_at=now)
    )


# ------------------------------------------------------------------ the sweep's buckets
# Each guards its source state itself and repeats its selection condition (`expired`,
# `stale`), so two sweeps at once, or a sweep racing a worker that just renewed its lease,
# never move a row twice or move a live one.


# run: running(expired) -> failed
def fail_expired_runs(ids: Sequence[Any], expired: ColumnElement[bool], now: datetime) -> Update:
    """Running runs whose lease expired (no process renews it) fail, resumable."""
    return (
        update(_runs)
        .where(_runs.c.id.in_(ids), _runs.c.state == RunState.RUNNING, expired)
        .values(
            state=RunState.FAILED,
            finished_at=now,
            lease_expires_at=None,
            error_text=literal(
                "lease expired: no process renewed it (killed?); resume with `episodic runs resume "
            )
            + _runs.c.id
            + literal("`"),
        )
        .returning(_runs.c.id)
    )


# item: running(expired) -> failed
def fail_expired_items(ids: Sequence[Any], expired: ColumnElement[bool], now: datetime) -> Update:
    """Running items whose claim lease expired fail (claim cleared; an open submission stays
    as it is: an accepted job keeps its reference and a resume collects it)."""
    return (
        update(_items)
        .where(
            in_id_order(_items, and_(_items.c.id.in_(ids), expired)),
            _items.c.state == ItemState.RUNNING,
            expired,
        )
        .values(
            state=ItemState.FAILED,
            claim_owner=None,
            lease_expires_at=None,
            finished_at=now,
            error_text="lease expired: its worker stopped renewing the claim; "
            "a resume continues it (an accepted job is collected, never bought again)",
        )
        .returning(_items.c.id)
    )


# run: pending(stale) -> cancelled
def cancel_stale_pending(
    ids: Sequence[Any], stale: ColumnElement[bool], now: datetime, pending_ttl_s: float
) -> Update:
    """Pending runs older than the pending TTL (never started) are cancelled."""
    return (
        update(_runs)
        .where(_runs.c.id.in_(ids), _runs.c.state == RunState.PENDING, stale)
        .values(
            state=RunState.CANCELLED,
            finished_at=now,
            error_text=f"never started within {pending_ttl_s:g} s: cancelled by the sweep",
        )
        .returning(_runs.c.id)
    )
