"""Runs, their items and planning reads (the ledger's writes live in `storage.claims`).

Every state change is one guarded statement (``UPDATE … WHERE id = :id AND state IN
(:allowed)``, rowcount checked): reading a state in Python and then writing it is a race
under Postgres READ COMMITTED. A run does not own its items: `run_items` records which items
each run was asked to finish, and two runs of one episode share them (the claim on an item,
not the run, decides who pays for it). Planning reads are set-based: a few queries for all
items of an episode, however many there are.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Select,
    Table,
    and_,
    exists,
    func,
    insert,
    or_,
    select,
    update,
)

from core.dedup import Admission, RunRequest
from core.errors import (
    CommandNotAllowed,
    EpisodeNotFound,
    IdempotencyKeyReused,
    InvalidTransition,
    RunNotFound,
    StorageError,
    frozen_plan,
)
from core.playlist import PlannedItem
from core.runs import INTERRUPTED, Item, ItemSnapshot, Run, RunCounts
from core.states import (
    FROZEN_PLAN_STATES,
    LIVE_RUN_STATES,
    RUN_TRANSITIONS,
    EpisodeState,
    ItemState,
    RunState,
    SubmissionState,
)
from storage import tx
from storage.base import utcnow
from storage.lock import keyed_transaction
from storage.models import (
    CostEntryRow,
    EpisodeEventRow,
    EpisodePlanRow,
    EpisodeRow,
    ItemRow,
    ReferenceImageRow,
    RunItemRow,
    RunRow,
    SubmissionRow,
)
from storage.tx import idempotent, retry_outages

_episodes: Table = EpisodeRow.__table__  # type: ignore[assignment]
_plans: Table = EpisodePlanRow.__table__  # type: ignore[assignment]
_runs: Table = RunRow.__table__  # type: ignore[assignment]
_items: Table = ItemRow.__table__  # type: ignore[assignment]
_members: Table = RunItemRow.__table__  # type: ignore[assignment]
_subs: Table = SubmissionRow.__table__  # type: ignore[assignment]
_costs: Table = CostEntryRow.__table__  # type: ignore[assignment]
_events: Table = EpisodeEventRow.__table__  # type: ignore[assignment]
_images: Table = ReferenceImageRow.__table__  # type: ignore[assignment]

OPEN_SUBMISSION_STATES = (SubmissionState.INTENT, SubmissionState.ACCEPTED, SubmissionState.UNKNOWN)
_T = TypeVar("_T")
_COMPLETED = ItemSnapshot(ItemState.COMPLETED, 0, None, None)


@dataclass(frozen=True, slots=True)
class DedupPolicy:
    """Seconds: the dedup window, the pending TTL, and the lease assumed for a running run
    that never recorded one (rows written before run leases existed)."""

    window_s: float = 900.0
    pending_ttl_s: float = 900.0
    fallback_lease_s: float = 30.0


def run_alive(now: datetime, fallback_lease_s: float) -> ColumnElement[bool]:
    """A running run's lease is live: renewed by a heartbeat, or (no lease recorded) its
    latest sign of life ``COALESCE(heartbeat_at, started_at, created_at)`` is recent."""
    return or_(
        _runs.c.lease_expires_at >= now,
        and_(
            _runs.c.lease_expires_at.is_(None),
            func.coalesce(_runs.c.heartbeat_at, _runs.c.started_at, _runs.c.created_at)
            >= now - timedelta(seconds=fallback_lease_s),
        ),
    )


def active_run(now: datetime, policy: DedupPolicy) -> ColumnElement[bool]:
    """Pending and younger than the pending TTL, or running with a live lease."""
    return or_(
        and_(
            _runs.c.state == RunState.PENDING,
            _runs.c.created_at >= now - timedelta(seconds=policy.pending_ttl_s),
        ),
        and_(_runs.c.state == RunState.RUNNING, run_alive(now, policy.fallback_lease_s)),
    )


def sources_of(target: RunState) -> list[str]:
    """The run states from which `target` may be reached (core.states is the one table)."""
    return [s.value for s, targets in RUN_TRANSITIONS.items() if target in targets]


class ItemIndex:
    """Snapshots of an episode's items by idempotency key (completed ones kept as bare keys)."""

    def __init__(self, completed: set[str], others: dict[str, ItemSnapshot]) -> None:
        self._completed = completed
        self._others = others

    def get(self, key: str) -> ItemSnapshot | None:
        return _COMPLETED if key in self._completed else self._others.get(key)


@retry_outages
class RunStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # ------------------------------------------------------------------ episodes and plans
    def episode_pk(self, pipeline: str, episode_id: str) -> int:
        with tx.read(self.engine) as conn:
            pk = conn.execute(
                select(_episodes.c.id).where(
                    _episodes.c.pipeline == pipeline, _episodes.c.episode_id == episode_id
                )
            ).scalar()
        if pk is None:
            raise EpisodeNotFound(pipeline, episode_id)
        return int(pk)

    def record_plan(
        self,
        episode_pk: int,
        playlist: dict[str, Any],
        sha256: str,
        references: list[str],
        source: str | None,
        reference_image: tuple[str, str, bytes] | None = None,
    ) -> bool:
        """Store the playlist unless the newest plan is the same; True if it was stored.
        `reference_image` (sha256, media type, bytes) is kept, content-addressed, in the same
        transaction.

        One transaction with the episode row locked (``FOR UPDATE``; SQLite: the write lock),
        so a plan and a decision never interleave: an approved or assembled episode's plan is
        frozen (`CommandNotAllowed`), and a changed plan moves a generated or rejected episode
        back to ``allocated`` (its new images must be generated and reviewed).
        """
        record = PlanRecord(playlist, sha256, references, source, reference_image)
        with tx.write(self.engine) as conn:
            return _record_plan_in(conn, episode_pk, record)[1]

    def latest_plan(self, episode_pk: int) -> tuple[dict[str, Any], list[str]] | None:
        recorded = self.current_plan(episode_pk)
        return None if recorded is None else (recorded[1], recorded[2])

    def current_plan(self, episode_pk: int) -> tuple[int, dict[str, Any], list[str]] | None:
        """The newest recorded plan: (its row id, playlist, reference hashes), or None."""
        with tx.read(self.engine) as conn:
            return newest_plan(conn, episode_pk)

    @idempotent
    def mark_generated(
        self,
        episode_pk: int,
        planned_keys: frozenset[str],
        plan_id: int | None,
        detail: dict[str, Any],
    ) -> bool:
        """Move the episode to ``generated`` if every key of its plan is completed and that
        plan (`plan_id`, when given) is still the newest: one transaction with the episode
        row locked, the same lock `record_plan` takes, so a plan recorded meanwhile is either
        seen here (nothing moves) or moves the episode back itself. Only an allocated episode
        moves: a decided one (approved, assembled, rejected) stays, since a decision stands
        until the plan changes or `reopen` (both move it to allocated first). True if every
        planned image is completed under the newest plan."""
        from storage.review import move_episode

        if not planned_keys:
            return False
        with tx.write(self.engine) as conn:
            state = conn.execute(
                select(_episodes.c.state).where(_episodes.c.id == episode_pk).with_for_update()
            ).scalar_one()
            if plan_id is not None and _newest_plan_id(conn, episode_pk) != plan_id:
                return False
            completed = set(
                conn.execute(
                    select(_items.c.idempotency_key).where(
                        _items.c.episode_pk == episode_pk,
                        _items.c.state == ItemState.COMPLETED,
                    )
                ).scalars()
            )
            if not planned_keys <= completed:
                return False
            if state == EpisodeState.ALLOCATED:
                move_episode(conn, episode_pk, EpisodeState.GENERATED, detail)
        return True

    # ------------------------------------------------------------------ planning
    def snapshots(self, episode_pk: int) -> ItemIndex:
        """Every item of the episode, set-based: three queries however many items there are.

        Completed items (the bulk of a resume) are fetched as bare keys; only the rest are
        fetched with the details planning needs.
        """
        done = ItemState.COMPLETED.value
        with tx.read(self.engine) as conn:
            completed = set(
                conn.execute(
                    select(_items.c.idempotency_key).where(
                        _items.c.episode_pk == episode_pk, _items.c.state == done
                    )
                )
                .scalars()
                .all()
            )
            open_subs: dict[int, str] = {
                row.item_pk: row.state
                for row in conn.execute(
                    select(_subs.c.item_pk, _subs.c.state)
                    .join(_items, _items.c.id == _subs.c.item_pk)
                    .where(
                        _items.c.episode_pk == episode_pk,
                        _items.c.state != done,
                        _subs.c.state.in_([s.value for s in OPEN_SUBMISSION_STATES]),
                    )
                )
            }
            rows = conn.execute(
                select(
                    _items.c.id,
                    _items.c.idempotency_key,
                    _items.c.state,
                    _items.c.attempts,
                    _items.c.lease_expires_at,
                    _items.c.claim_run_id,
                ).where(_items.c.episode_pk == episode_pk, _items.c.state != done)
            ).all()
        others = {
            row.idempotency_key: ItemSnapshot(
                row.state,
                row.attempts,
                row.lease_expires_at,
                open_subs.get(row.id),
                row.claim_run_id,
            )
            for row in rows
        }
        return ItemIndex(completed, others)

    def create_run(
        self,
        episode_pk: int,
        command: str,
        params: dict[str, Any],
        new_items: Sequence[PlannedItem],
        reuse_keys: Iterable[str],
    ) -> str:
        """Insert a run without any dedup (benchmarks and tests; callers use `admit`)."""
        run_id = str(uuid.uuid4())
        with tx.write(self.engine) as conn:
            _insert_run(conn, run_id, episode_pk, command, params, new_items, reuse_keys, {})
        return run_id

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
        """The write choke point (DESIGN 6): reuse an active run of the same request, or
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
            # request's run is reused or taken over): `tx.lock_membership`.
            tx.lock_membership(conn, [episode_pk])
            mine = conn.execute(select(_runs.c.plan_id).where(_runs.c.id == run_id)).first()
            if create and mine is not None:  # a retry after a lost COMMIT: the run it made
                return Admission(
                    run_id, created=True, fingerprint=fingerprint, plan_id=mine.plan_id
                )
            if plan_id is not None and _newest_plan_id(conn, episode_pk) != plan_id:
                raise CommandNotAllowed(
                    "the episode was re-planned while this run was being prepared; "
                    "nothing was spent: run the command again"
                )
            if policy.window_s > 0:
                recent = (_runs.c.fingerprint == fingerprint) & (
                    _runs.c.created_at >= now - timedelta(seconds=policy.window_s)
                )
                if request.idempotency_key is not None:
                    other = conn.execute(
                        select(_runs.c.id)
                        .where(recent, _runs.c.request_sha256 != request.request_sha256)
                        .order_by(_runs.c.created_at.desc())
                        .limit(1)
                    ).scalar()
                    if other is not None:
                        raise IdempotencyKeyReused(request.idempotency_key, other)
            if replan is not None:  # admissible: the changed plan is the one it runs
                plan_id = _record_plan_in(conn, episode_pk, replan)[0]
            if policy.window_s > 0 and not request.allow_duplicate:
                # One indexed read: the request's unfinished runs within the window.
                unfinished = conn.execute(
                    select(_runs.c.id, _runs.c.state, active_run(now, policy).label("active"))
                    .where(
                        recent,
                        _runs.c.state.in_(LIVE_RUN_STATES),
                    )
                    .order_by(_runs.c.created_at.desc())
                    .limit(20)
                ).all()
                for row in unfinished:
                    if row.active:  # the same request (same items): for the newest plan
                        _adopt_plan(conn, row.id, plan_id)
                        return Admission(
                            row.id, deduplicated=True, fingerprint=fingerprint, plan_id=plan_id
                        )
                dead = next((r.id for r in unfinished if r.state != RunState.PENDING), None)
                if dead is not None:  # the same request, its process gone or paused
                    # (Ctrl-C, SIGTERM): continue it rather than leave it beside a new run
                    conn.execute(  # alive again: a concurrent caller joins, not re-takes
                        update(_runs)
                        .where(_runs.c.id == dead)
                        .values(
                            heartbeat_at=now,
                            lease_expires_at=now + timedelta(seconds=policy.fallback_lease_s),
                        )
                    )
                    _adopt_plan(conn, dead, plan_id)
                    return Admission(
                        dead, taken_over=True, fingerprint=fingerprint, plan_id=plan_id
                    )
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

    # ------------------------------------------------------------------ runs
    def get_run(self, run_id: str) -> Run:
        with tx.read(self.engine) as conn:
            row = conn.execute(
                select(_runs, _episodes.c.episode_id, _episodes.c.pipeline)
                .join(_episodes, _episodes.c.id == _runs.c.episode_pk)
                .where(_runs.c.id == run_id)
            ).first()
        if row is None:
            raise RunNotFound(f"run {run_id} not found")
        return _run(row)

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
            raise RunNotFound(f"run {run_id} not found")
        return str(state)

    @idempotent  # a repeat finds the run in `target` and answers False, as for a racer
    def transition_run(
        self,
        run_id: str,
        target: RunState,
        error_text: str | None = None,
        *,
        lease_s: float | None = None,
    ) -> bool:
        """Move the run to `target` with one guarded statement.

        Entering ``running`` starts the run's lease (`lease_s` seconds, renewed by every
        process working on it); any other target ends it. Returns True if this call moved
        the run, False if it already was there (a concurrent caller got there first). Raises
        `InvalidTransition` naming the current state when the move is not allowed from it
        (e.g. a run cancelled meanwhile), `RunNotFound`.
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
            if target == RunState.CANCELLED:  # before the run's row (tx.lock_membership)
                lock_membership_of_runs(conn, [run_id])
            moved = conn.execute(
                update(_runs)
                .where(_runs.c.id == run_id, _runs.c.state.in_(sources_of(target)))
                .values(**values)
            ).rowcount
            if moved and target == RunState.CANCELLED:
                cancel_orphaned_items(conn, [run_id], now)
            if moved:
                return True
            current = conn.execute(select(_runs.c.state).where(_runs.c.id == run_id)).scalar()
        if current is None:
            raise RunNotFound(f"run {run_id} not found")
        if current == target:
            return False
        raise InvalidTransition(f"run {run_id} is {current}: it cannot become {target}")

    def abandon_pending(self, run_id: str, reason: str) -> bool:
        """Cancel a run that never started (its creator was interrupted before starting it);
        False if it has started meanwhile (someone joined it): then it is left alone."""
        now = utcnow()
        with tx.write(self.engine) as conn:
            lock_membership_of_runs(conn, [run_id])  # before the run's row
            moved = conn.execute(
                update(_runs)
                .where(_runs.c.id == run_id, _runs.c.state == RunState.PENDING)
                .values(state=RunState.CANCELLED, finished_at=now, error_text=reason)
            ).rowcount
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
            _items.c.state == ItemState.RUNNING,
            _items.c.lease_expires_at > utcnow(),
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
            _subs.c.state.in_([s.value for s in OPEN_SUBMISSION_STATES]),
        )
        return self._members_where(
            run_id,
            _items.c.state == ItemState.FAILED,
            _items.c.error_text == INTERRUPTED,
            ~open_sub,
        )

    def reference_image(self, sha256: str) -> tuple[str, bytes] | None:
        """A plan's reference image: (media type, bytes), or None if none is recorded."""
        with tx.read(self.engine) as conn:
            row = conn.execute(
                select(_images.c.media_type, _images.c.content).where(_images.c.sha256 == sha256)
            ).first()
        return None if row is None else (str(row.media_type), bytes(row.content))

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

    def ask_provider_cancel(
        self, run_id: str, submission_pk: int, remote_ref: str, profile: str
    ) -> str | None:
        """Decide, for the cancel of `run_id`, whether its accepted job may be cancelled at
        the provider: the id of another live run that includes the job's item (the job is
        kept for it), or None after recording that the cancel is being asked (an episode
        event ``provider_cancel_asked``, committed before the provider's call).

        One transaction under the episode's `tx.lock_membership`, which run creation holds
        too: a run admitted over the item either is seen here (the job is kept) or is
        admitted after the record, and then knows, if it finds the job cancelled, that a
        cancel decided before it existed cancelled it (`cancel_asked_elsewhere`): it buys the
        item anew instead of failing it."""
        with tx.write(self.engine) as conn:
            lock_membership_of_runs(conn, [run_id])
            wanted = _wanted_elsewhere(conn, run_id, [submission_pk])
            if submission_pk in wanted:
                return wanted[submission_pk]
            _insert_event(
                conn,
                run_id,
                "provider_cancel_asked",
                {
                    "run_id": run_id,
                    "submission": submission_pk,
                    "remote_ref": remote_ref,
                    "profile": profile,
                },
            )
        return None

    def cancel_asked_elsewhere(self, episode_pk: int, submission_pk: int, run_id: str) -> bool:
        """Whether the cancel of a run other than `run_id` asked the provider to cancel this
        submission's job (`ask_provider_cancel`): a job such a run finds cancelled was
        cancelled on an operator's command, not by the provider."""
        with tx.read(self.engine) as conn:
            asked = conn.execute(
                select(_events.c.detail).where(
                    _events.c.episode_pk == episode_pk,
                    _events.c.kind == "provider_cancel_asked",
                )
            ).scalars()
            return any(
                isinstance(d, dict)
                and d.get("submission") == submission_pk
                and d.get("run_id") != run_id
                for d in asked
            )

    def record_provider_cancel(
        self, run_id: str, submission_pk: int, remote_ref: str, profile: str, answer: str
    ) -> None:
        """The ledger's note that a cancel was asked of the provider for an accepted job, and
        what it answered (an event of the run's episode, ``provider_cancel``)."""
        with tx.write(self.engine) as conn:
            _insert_event(
                conn,
                run_id,
                "provider_cancel",
                {
                    "run_id": run_id,
                    "submission": submission_pk,
                    "remote_ref": remote_ref,
                    "profile": profile,
                    "answer": answer[:200],
                },
            )

    def provider_cancel_answers(self, episode_pk: int) -> dict[int, str]:
        """The provider's latest answer to a cancel of each of the episode's submissions
        (``provider_cancel`` events, whichever run's cancel asked): submission pk -> answer."""
        with tx.read(self.engine) as conn:
            details = conn.execute(
                select(_events.c.detail)
                .where(_events.c.episode_pk == episode_pk, _events.c.kind == "provider_cancel")
                .order_by(_events.c.id)
            ).scalars()
            return {
                int(d["submission"]): str(d.get("answer", ""))
                for d in details
                if isinstance(d, dict) and isinstance(d.get("submission"), int)
            }

    def _members_where(self, run_id: str, *conditions: ColumnElement[bool]) -> list[Item]:
        query = (
            select(_items)
            .join(_members, _members.c.item_pk == _items.c.id)
            .where(_members.c.run_id == run_id, *conditions)
            .order_by(_items.c.position, _items.c.part, _items.c.candidate)
        )
        with tx.read(self.engine) as conn:
            return [item_from_row(row) for row in conn.execute(query).all()]

    def get_item(self, item_pk: int) -> Item:
        with tx.read(self.engine) as conn:
            return item_from_row(conn.execute(select(_items).where(_items.c.id == item_pk)).one())

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
                    func.coalesce(func.sum(_costs.c.amount_minor), 0), func.max(_costs.c.currency)
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
            cost_minor=int(cost[0]),
            currency=cost[1] or "USD",
        )

    def episode_spend(self, episode_pk: int) -> tuple[int, int, str]:
        """(paid submissions, cost in minor units, currency) of the episode over every run:
        what the ledger says the provider billed, not what the last run did."""
        with tx.read(self.engine) as conn:
            paid = conn.execute(
                select(func.count())
                .select_from(_subs)
                .join(_items, _items.c.id == _subs.c.item_pk)
                .where(_items.c.episode_pk == episode_pk)
            ).scalar_one()
            cost = conn.execute(
                select(
                    func.coalesce(func.sum(_costs.c.amount_minor), 0), func.max(_costs.c.currency)
                ).where(_costs.c.episode_pk == episode_pk)
            ).one()
        return int(paid), int(cost[0]), cost[1] or "USD"

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

    def episode_cost(self, episode_pk: int) -> int:
        with tx.read(self.engine) as conn:
            return int(
                conn.execute(
                    select(func.coalesce(func.sum(_costs.c.amount_minor), 0)).where(
                        _costs.c.episode_pk == episode_pk
                    )
                ).scalar_one()
            )


def _wanted_elsewhere(
    conn: Connection, run_id: str, submission_pks: Sequence[int]
) -> dict[int, str]:
    """Of these submissions, those whose item another live run (pending, running or
    paused) includes: submission pk -> that run's id (the oldest such run). Cancelling
    such a job at the provider would make that run pay for the item again (a provider
    may bill a cancelled job: Replicate does)."""
    other = live_memberships([run_id]).subquery()
    rows = conn.execute(
        select(_subs.c.id, func.min(other.c.run_id))
        .join(other, other.c.item_pk == _subs.c.item_pk)
        .where(_subs.c.id.in_(list(submission_pks)))
        .group_by(_subs.c.id)
    ).all()
    return {int(pk): str(run) for pk, run in rows}


def _insert_event(conn: Connection, run_id: str, kind: str, detail: dict[str, Any]) -> None:
    """An event of the run's episode."""
    episode_pk = conn.execute(select(_runs.c.episode_pk).where(_runs.c.id == run_id)).scalar_one()
    conn.execute(
        insert(_events).values(episode_pk=episode_pk, kind=kind, at=utcnow(), detail=detail)
    )


def newest_plan(conn: Connection, episode_pk: int) -> tuple[int, dict[str, Any], list[str]] | None:
    """`RunStore.current_plan` in the caller's transaction (a snapshot's reader)."""
    row = conn.execute(
        select(_plans.c.id, _plans.c.playlist, _plans.c.reference_sha256)
        .where(_plans.c.episode_pk == episode_pk)
        .order_by(_plans.c.id.desc())
        .limit(1)
    ).first()
    return None if row is None else (int(row[0]), dict(row[1]), list(row[2]))


def live_memberships(excluding: Sequence[str] = ()) -> Select[tuple[str, int]]:
    """(run_id, item_pk) of every live run (`LIVE_RUN_STATES`) but those in `excluding`:
    the runs that keep an item from being cancelled."""
    query = (
        select(_members.c.run_id, _members.c.item_pk)
        .join(_runs, _runs.c.id == _members.c.run_id)
        .where(_runs.c.state.in_(LIVE_RUN_STATES))
    )
    return query.where(_members.c.run_id.not_in(list(excluding))) if excluding else query


def lock_membership_of_runs(conn: Connection, run_ids: Sequence[str]) -> None:
    """`tx.lock_membership` for the episodes of these runs (read without locking a row)."""
    if conn.dialect.name != "postgresql" or not run_ids:
        return
    episodes = select(_runs.c.episode_pk).where(_runs.c.id.in_(list(run_ids))).distinct()
    tx.lock_membership(conn, conn.execute(episodes).scalars())


def cancel_orphaned_items(conn: Connection, run_ids: Sequence[str], now: datetime) -> int:
    """Terminalize the unstarted children of cancelled runs: their ``pending`` items that no
    other active run includes become ``cancelled``, decided under the runs' episodes'
    `tx.lock_membership` (a run being created with one of them is seen). Running items stay
    with their claim holder (its heartbeat sees the cancel and stops; a dead holder's lease
    expires and the sweep fails the item); submissions are never touched (they are the
    ledger's evidence)."""
    if not run_ids:
        return 0
    lock_membership_of_runs(conn, run_ids)  # held already by callers that follow the order
    live_elsewhere = select(live_memberships(run_ids).subquery().c.item_pk)
    orphaned = and_(
        _items.c.id.in_(select(_members.c.item_pk).where(_members.c.run_id.in_(list(run_ids)))),
        _items.c.id.not_in(live_elsewhere),
        _items.c.state == ItemState.PENDING,
    )
    return int(
        conn.execute(
            update(_items)
            .where(tx.in_id_order(_items, orphaned), _items.c.state == ItemState.PENDING)
            .values(state=ItemState.CANCELLED, finished_at=now)
        ).rowcount
    )


def _newest_plan_id(conn: Connection, episode_pk: int) -> int | None:
    """The id of the episode's newest recorded plan (None: none)."""
    newest = conn.execute(
        select(func.max(_plans.c.id)).where(_plans.c.episode_pk == episode_pk)
    ).scalar()
    return None if newest is None else int(newest)


def _adopt_plan(conn: Connection, run_id: str, plan_id: int | None) -> None:
    """A run of the same request (the same items) is a run of the newest plan too: a plan
    recorded again after another (A, B, A) must not make it look re-planned."""
    if plan_id is not None:
        conn.execute(
            update(_runs)
            .where(_runs.c.id == run_id, _runs.c.plan_id.is_not(None))
            .values(plan_id=plan_id)
        )


@dataclass(frozen=True, slots=True)
class PlanRecord:
    """A plan to record: the playlist (as JSON), its hash, the reference assets' hashes, where
    it came from, and its reference image (sha256, media type, bytes) if it has one."""

    playlist: dict[str, Any]
    sha256: str
    references: list[str]
    source: str | None
    reference_image: tuple[str, str, bytes] | None = None


def _record_plan_in(conn: Connection, episode_pk: int, record: PlanRecord) -> tuple[int, bool]:
    """`RunStore.record_plan` inside `conn`'s transaction: (the newest plan's id, whether
    this call stored it). Raises `CommandNotAllowed` for a frozen plan."""
    from storage.review import move_episode

    state = conn.execute(
        select(_episodes.c.state).where(_episodes.c.id == episode_pk).with_for_update()
    ).scalar_one()
    if state in FROZEN_PLAN_STATES:
        episode_id = conn.execute(
            select(_episodes.c.episode_id).where(_episodes.c.id == episode_pk)
        ).scalar_one()
        raise frozen_plan(episode_id, state)
    latest = conn.execute(
        select(_plans.c.id, _plans.c.playlist_sha256, _plans.c.reference_sha256)
        .where(_plans.c.episode_pk == episode_pk)
        .order_by(_plans.c.id.desc())
        .limit(1)
    ).first()
    if record.reference_image is not None:
        digest, media_type, content = record.reference_image
        known = conn.execute(select(_images.c.sha256).where(_images.c.sha256 == digest)).first()
        if known is None:
            conn.execute(
                insert(_images).values(
                    sha256=digest, media_type=media_type, content=content, created_at=utcnow()
                )
            )
    if (
        latest is not None
        and latest.playlist_sha256 == record.sha256
        and list(latest.reference_sha256) == record.references
    ):
        return int(latest.id), False
    plan_id = conn.execute(
        insert(_plans)
        .values(
            episode_pk=episode_pk,
            playlist=record.playlist,
            playlist_sha256=record.sha256,
            reference_sha256=record.references,
            source_path=record.source[:1024] if record.source else None,
            created_at=utcnow(),
        )
        .returning(_plans.c.id)
    ).scalar_one()
    if state in (EpisodeState.GENERATED, EpisodeState.REJECTED):
        move_episode(
            conn,
            episode_pk,
            EpisodeState.ALLOCATED,
            {"reason": "re-planned", "plan_sha256": record.sha256},
            source=EpisodeState(state),
        )
    return int(plan_id), True


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
    tx.lock_membership(conn, [episode_pk])  # before any item row: see tx.lock_membership
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
    if pks:  # in id order, as every statement that locks several items (tx.in_id_order)
        conn.execute(insert(_members), [{"run_id": run_id, "item_pk": pk} for pk in sorted(pks)])
    restarted = and_(
        _items.c.id.in_(select(_members.c.item_pk).where(_members.c.run_id == run_id)),
        _items.c.state == ItemState.CANCELLED,
    )
    conn.execute(  # a cancelled item included in a new run starts over as pending
        update(_items)
        .where(tx.in_id_order(_items, restarted), _items.c.state == ItemState.CANCELLED)
        .values(state=ItemState.PENDING)
    )
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


def completed_outputs(engine: Engine, episode_pk: int) -> list[dict[str, Any]]:
    """Completed items of an episode with the remote ref and cost of their paid call."""
    with tx.read(engine) as conn:
        rows = conn.execute(
            select(
                _items.c.idempotency_key,
                _items.c.video_id,
                _items.c.part,
                _items.c.candidate,
                _items.c.position,
                _items.c.output_path,
                _items.c.output_sha256,
                _subs.c.remote_ref,
                _costs.c.amount_minor,
                _costs.c.currency,
            )
            .join(_subs, (_subs.c.item_pk == _items.c.id) & (_subs.c.state == "succeeded"))
            .join(_costs, _costs.c.submission_pk == _subs.c.id)
            .where(_items.c.episode_pk == episode_pk, _items.c.state == ItemState.COMPLETED)
            .order_by(_items.c.position, _items.c.part, _items.c.candidate)
        ).all()
    return [dict(row._mapping) for row in rows]
