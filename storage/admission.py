"""The write choke point: a request becomes a run here, and only here.

`AdmissionStore.admit` reuses an active run of the same request (dedup), takes over a dead or
paused one, or creates one, in one transaction serialized per request fingerprint; `join`
tells a caller resuming a run whether it joins work in progress. A new run's membership
(`run_items`) is written here: another run of the episode may create or include the same
items at the same moment, and an item that already exists is joined, never an error.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, Connection, Engine, Table, and_, insert, or_, select, update

from episodic.core.dedup import Admission, RunRequest
from episodic.core.errors import CommandNotAllowed, IdempotencyKeyReused, StorageError
from episodic.core.playlist import PlannedItem
from episodic.core.states import LIVE_RUN_STATES, ItemState, RunState
from episodic.storage import locks, predicates, statements, tx
from episodic.storage.base import utcnow
from episodic.storage.locks import keyed_transaction
from episodic.storage.models import ItemRow, RunItemRow, RunRow
from episodic.storage.plans import PlanRecord, record_plan_in
from episodic.storage.tx import idempotent, retry_outages

_runs: Table = RunRow.__table__  # type: ignore[assignment]
_items: Table = ItemRow.__table__  # type: ignore[assignment]
_members: Table = RunItemRow.__table__  # type: ignore[assignment]

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class DedupPolicy:
    """Seconds: the dedup window, the pending TTL, and the lease assumed for a running run
    that never recorded one (rows written before run leases existed)."""

    window_s: float = 900.0
    pending_ttl_s: float = 900.0
    fallback_lease_s: float = 30.0


def active_run(now: datetime, policy: DedupPolicy) -> ColumnElement[bool]:
    """Pending and younger than the pending TTL, or running with a live lease."""
    return or_(
        and_(
            _runs.c.state == RunState.PENDING,
            ~predicates.pending_expired(now, policy.pending_ttl_s),
        ),
        predicates.live_run(now, policy.fallback_lease_s),
    )


@retry_outages
class AdmissionStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @idempotent
    def admit(
        self,
        episode_pk: int,
        request: RunRequest,
        params: dict[str, Any],
        new_items: Sequence[PlannedItem],
        reuse_keys: Sequence[str],
        *,
        policy: DedupPolicy,
        create: bool = True,
        run_id: str,
        plan_id: int | None = None,
        replan: PlanRecord | None = None,
    ) -> Admission:
        """The write choke point: reuse an active run of the same request, or
        create one, in one transaction serialized per fingerprint.

        `run_id` is the id a created run gets, chosen by the caller before the call: a retry
        after a COMMIT whose reply was lost (a database restart) finds the run it made and
        answers ``created=True`` again, instead of taking its own pending run for another
        caller's (or, with deduplication off, creating a second one).

        Postgres takes ``pg_advisory_xact_lock`` on the fingerprint (READ COMMITTED would let
        two callers both see "no run" and both insert); SQLite's ``BEGIN IMMEDIATE`` already
        serializes writers. Within ``policy.window_s`` of its creation a ``pending`` run
        (younger than the pending TTL) or a ``running`` run whose lease is live is reused
        (``deduplicated=True``), unless the request allows duplicates; a ``running`` run of
        the same request whose lease expired (its process died) or a ``paused`` one (Ctrl-C,
        SIGTERM) is taken over (``taken_over=True``) rather than left beside a new one. An
        explicit idempotency key seen within the window with other parameters raises
        `IdempotencyKeyReused`.
        With ``create=False`` (nothing to do) no run is written: the answer has no run id.

        `plan_id`: the recorded plan the request was prepared from. If the episode was
        re-planned since, nothing is written (`CommandNotAllowed`: ask again). `replan`: a
        changed plan (`generate --hero-candidates`), recorded here once the request is
        admissible, in the same transaction (a refused request records nothing). The run is
        admitted for the resulting plan (``Admission.plan_id``).
        """
        fingerprint = request.fingerprint
        now = utcnow()
        with keyed_transaction(self.engine, f"run:{fingerprint}") as conn:
            # Before the episode's row (a changed plan locks it) and any run's row (a
            # request's run is reused or taken over): `locks.lock_membership`.
            locks.lock_membership(conn, [episode_pk])
            made = _made_already(conn, run_id, fingerprint)
            if create and made is not None:  # a retry after a lost COMMIT: the run it made
                return made
            if plan_id is not None and predicates.newest_plan_id(conn, episode_pk) != plan_id:
                raise CommandNotAllowed(
                    "the episode was re-planned while this run was being prepared; "
                    "nothing was spent: run the command again"
                )
            key = request.idempotency_key
            if policy.window_s > 0 and key is not None:
                _refuse_reused_key(conn, key, request, _recent(request, now, policy))
            if replan is not None:  # admissible: the changed plan is the one it runs
                plan_id = record_plan_in(conn, episode_pk, replan)[0]
            if policy.window_s > 0 and not request.allow_duplicate:
                same = _same_request(conn, request, now, policy, plan_id)
                if same is not None:
                    return same
            if not create:
                return Admission(None, fingerprint=fingerprint, plan_id=plan_id)
            extra = {
                "fingerprint": fingerprint,
                "request_sha256": request.request_sha256,
                "idempotency_key": request.idempotency_key,
                "batch_id": request.batch_id,
                "plan_id": plan_id,
            }
            _insert_run(
                conn, run_id, episode_pk, request.command, params, new_items, reuse_keys, extra
            )
        return Admission(run_id, created=True, fingerprint=fingerprint, plan_id=plan_id)

    def join(self, run_id: str, policy: DedupPolicy) -> bool:
        """True if `run_id` is active now (pending, or running with a live lease): a caller
        resuming it joins work in progress rather than recovering a dead run."""
        with tx.read(self.engine) as conn:
            return (
                conn.execute(
                    select(_runs.c.id).where(_runs.c.id == run_id, active_run(utcnow(), policy))
                ).first()
                is not None
            )


def _made_already(conn: Connection, run_id: str, fingerprint: str) -> Admission | None:
    """The answer `admit` gave when it created `run_id` (None: no such run): a retry after
    a COMMIT whose reply was lost finds the run it made."""
    mine = conn.execute(select(_runs.c.plan_id).where(_runs.c.id == run_id)).first()
    if mine is None:
        return None
    return Admission(run_id, created=True, fingerprint=fingerprint, plan_id=mine.plan_id)


def _recent(request: RunRequest, now: datetime, policy: DedupPolicy) -> ColumnElement[bool]:
    """A run of the request's fingerprint created within the dedup window."""
    return (_runs.c.fingerprint == request.fingerprint) & (
        _runs.c.created_at >= now - timedelta(seconds=policy.window_s)
    )


def _refuse_reused_key(
    conn: Connection, key: str, request: RunRequest, recent: ColumnElement[bool]
) -> None:
    """Raises `IdempotencyKeyReused` if `key`, the request's explicit idempotency key, was
    seen within the window (`recent`) with other parameters."""
    other = conn.execute(
        select(_runs.c.id)
        .where(recent, _runs.c.request_sha256 != request.request_sha256)
        .order_by(_runs.c.created_at.desc())
        .limit(1)
    ).scalar()
    if other is not None:
        raise IdempotencyKeyReused(key, other)


def _same_request(
    conn: Connection, request: RunRequest, now: datetime, policy: DedupPolicy, plan_id: int | None
) -> Admission | None:
    """The dedup: the request's newest active run within the window is joined
    (``deduplicated``); else its newest dead (lease expired) or paused one is taken over
    (``taken_over``), both now runs of `plan_id`. None: no run of the request to reuse."""
    # One indexed read: the request's unfinished runs within the window.
    unfinished = conn.execute(
        select(_runs.c.id, _runs.c.state, active_run(now, policy).label("active"))
        .where(
            _recent(request, now, policy),
            _runs.c.state.in_(LIVE_RUN_STATES),
        )
        .order_by(_runs.c.created_at.desc())
        .limit(20)
    ).all()
    fingerprint = request.fingerprint
    for row in unfinished:
        if row.active:  # the same request (same items): for the newest plan
            _adopt_plan(conn, row.id, plan_id)
            return Admission(row.id, deduplicated=True, fingerprint=fingerprint, plan_id=plan_id)
    dead = next((r.id for r in unfinished if r.state != RunState.PENDING), None)
    if dead is None:
        return None
    # The same request, its process gone or paused (Ctrl-C, SIGTERM): continue it rather
    # than leave it beside a new run.
    conn.execute(  # alive again: a concurrent caller joins, not re-takes
        update(_runs)
        .where(_runs.c.id == dead)
        .values(
            heartbeat_at=now,
            lease_expires_at=now + timedelta(seconds=policy.fallback_lease_s),
        )
    )
    _adopt_plan(conn, dead, plan_id)
    return Admission(dead, taken_over=True, fingerprint=fingerprint, plan_id=plan_id)


def _adopt_plan(conn: Connection, run_id: str, plan_id: int | None) -> None:
    """A run of the same request (the same items) is a run of the newest plan too: a plan
    recorded again after another (A, B, A) must not make it look re-planned."""
    if plan_id is not None:
        conn.execute(
            update(_runs)
            .where(_runs.c.id == run_id, _runs.c.plan_id.is_not(None))
            .values(plan_id=plan_id)
        )


def _insert_run(
    conn: Connection,
    run_id: str,
    episode_pk: int,
    command: str,
    params: dict[str, Any],
    new_items: Sequence[PlannedItem],
    reuse_keys: Iterable[str],
    extra: dict[str, Any],
) -> str:
    """Insert the run (pending) and its membership, creating items that do not exist yet.

    Another run of the episode may create the same items at the same moment: an item
    that already exists is joined, never an error (``ON CONFLICT DO NOTHING``).
    """
    now = utcnow()
    keys = [it.idempotency_key for it in new_items] + list(reuse_keys)
    locks.lock_membership(conn, [episode_pk])  # before any item row: see locks.lock_membership
    conn.execute(
        insert(_runs).values(
            id=run_id,
            episode_pk=episode_pk,
            command=command,
            state=RunState.PENDING,
            params=params,
            created_at=now,
            **extra,
        )
    )
    if new_items:
        _insert_new_items(conn, episode_pk, run_id, new_items, now)
    pks: list[int] = []
    for key_chunk in _chunks(keys, 500):
        pks.extend(
            conn.execute(
                select(_items.c.id).where(
                    _items.c.idempotency_key.in_(key_chunk),
                    _items.c.episode_pk == episode_pk,
                )
            ).scalars()
        )
    if len(pks) != len(set(keys)):
        raise StorageError(
            f"{len(set(keys)) - len(pks)} planned item keys belong to another episode"
        )
    if pks:  # in id order, as every statement that locks several items (locks.in_id_order)
        conn.execute(insert(_members), [{"run_id": run_id, "item_pk": pk} for pk in sorted(pks)])
    conn.execute(statements.restart_cancelled(run_id))  # cancelled items start over
    return run_id


def _insert_new_items(
    conn: Connection,
    episode_pk: int,
    run_id: str,
    new_items: Sequence[PlannedItem],
    now: datetime,
) -> None:
    rows = [
        {
            "episode_pk": episode_pk,
            "run_id": run_id,
            "idempotency_key": it.idempotency_key,
            "position": it.index,
            "video_id": it.video_id,
            "part": it.part,
            "candidate": it.candidate,
            "prompt": it.prompt,
            "seed": it.seed,
            "state": ItemState.PENDING,
            "attempts": 0,
            "force_resubmit": False,
            "created_at": now,
        }
        for it in new_items
    ]
    statement = tx.insert_for(conn, _items).on_conflict_do_nothing(
        index_elements=["idempotency_key"]
    )
    conn.execute(statement, rows)


def _chunks(values: Sequence[_T], size: int) -> Iterable[Sequence[_T]]:
    for start in range(0, len(values), size):
        yield values[start : start + size]
