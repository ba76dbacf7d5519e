"""Runs, items and the spend ledger (submissions, cost entries).

Every state change goes through `core.states` (one place for the allowed transitions) and is
committed in its own short transaction, so a crash loses at most the step in flight. Planning
reads are set-based: one query for all items of an episode, however many there are.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Engine, Table, func, insert, select, update

from core.errors import EpisodeNotFound, RunNotFound
from core.playlist import PlannedItem
from core.runs import Item, ItemSnapshot, Run, RunCounts, Submission
from core.states import (
    ItemState,
    RunState,
    SubmissionState,
    check_item_transition,
    check_run_transition,
)
from storage import tx
from storage.base import utcnow
from storage.models import (
    CostEntryRow,
    EpisodePlanRow,
    EpisodeRow,
    ItemRow,
    RunRow,
    SubmissionRow,
)

_episodes: Table = EpisodeRow.__table__  # type: ignore[assignment]
_plans: Table = EpisodePlanRow.__table__  # type: ignore[assignment]
_runs: Table = RunRow.__table__  # type: ignore[assignment]
_items: Table = ItemRow.__table__  # type: ignore[assignment]
_subs: Table = SubmissionRow.__table__  # type: ignore[assignment]
_costs: Table = CostEntryRow.__table__  # type: ignore[assignment]

OPEN_SUBMISSION_STATES = (SubmissionState.INTENT, SubmissionState.ACCEPTED, SubmissionState.UNKNOWN)


_COMPLETED = ItemSnapshot(ItemState.COMPLETED, 0, None, None)


class ItemIndex:
    """Snapshots of an episode's items by idempotency key (completed ones kept as bare keys)."""

    def __init__(self, completed: set[str], others: dict[str, ItemSnapshot]) -> None:
        self._completed = completed
        self._others = others

    def get(self, key: str) -> ItemSnapshot | None:
        return _COMPLETED if key in self._completed else self._others.get(key)


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
    ) -> bool:
        """Store the playlist unless the newest plan is the same; True if it was stored."""
        with tx.write(self.engine) as conn:
            latest = conn.execute(
                select(_plans.c.playlist_sha256, _plans.c.reference_sha256)
                .where(_plans.c.episode_pk == episode_pk)
                .order_by(_plans.c.id.desc())
                .limit(1)
            ).first()
            if latest is not None and latest[0] == sha256 and list(latest[1]) == references:
                return False
            conn.execute(
                insert(_plans).values(
                    episode_pk=episode_pk,
                    playlist=playlist,
                    playlist_sha256=sha256,
                    reference_sha256=references,
                    source_path=source,
                    created_at=utcnow(),
                )
            )
            return True

    def latest_plan(self, episode_pk: int) -> tuple[dict[str, Any], list[str]] | None:
        with tx.read(self.engine) as conn:
            row = conn.execute(
                select(_plans.c.playlist, _plans.c.reference_sha256)
                .where(_plans.c.episode_pk == episode_pk)
                .order_by(_plans.c.id.desc())
                .limit(1)
            ).first()
        return None if row is None else (dict(row[0]), list(row[1]))

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
                    _items.c.started_at,
                ).where(_items.c.episode_pk == episode_pk, _items.c.state != done)
            ).all()
        others = {
            row.idempotency_key: ItemSnapshot(
                row.state, row.attempts, row.started_at, open_subs.get(row.id)
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
        """Insert the run (pending), its new items, and attach reused items, atomically."""
        run_id = str(uuid.uuid4())
        now = utcnow()
        with tx.write(self.engine) as conn:
            conn.execute(
                insert(_runs).values(
                    id=run_id,
                    episode_pk=episode_pk,
                    command=command,
                    state=RunState.PENDING,
                    params=params,
                    created_at=now,
                )
            )
            if new_items:
                conn.execute(
                    insert(_items),
                    [
                        {
                            "episode_pk": episode_pk,
                            "run_id": run_id,
                            "idempotency_key": it.idempotency_key,
                            "position": it.index,
                            "video_id": it.video_id,
                            "part": it.part,
                            "prompt": it.prompt,
                            "seed": it.seed,
                            "state": ItemState.PENDING,
                            "attempts": 0,
                            "force_resubmit": False,
                            "created_at": now,
                        }
                        for it in new_items
                    ],
                )
            keys = list(reuse_keys)
            for chunk in _chunks(keys, 500):
                conn.execute(
                    update(_items)
                    .where(_items.c.idempotency_key.in_(chunk), _items.c.episode_pk == episode_pk)
                    .values(run_id=run_id, force_resubmit=bool(params.get("force_resubmit")))
                )
            conn.execute(  # a cancelled item attached to a new run starts over as pending
                update(_items)
                .where(_items.c.run_id == run_id, _items.c.state == ItemState.CANCELLED)
                .values(state=ItemState.PENDING)
            )
        return run_id

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

    def transition_run(self, run_id: str, target: RunState, error_text: str | None = None) -> None:
        now = utcnow()
        with tx.write(self.engine) as conn:
            current = conn.execute(select(_runs.c.state).where(_runs.c.id == run_id)).scalar()
            if current is None:
                raise RunNotFound(f"run {run_id} not found")
            if current == target:
                return
            check_run_transition(current, target)
            values: dict[str, Any] = {
                "state": target,
                "error_text": error_text,
                "heartbeat_at": now,
            }
            if target == RunState.RUNNING:
                values.update(started_at=now, finished_at=None)
            elif target in (
                RunState.COMPLETED,
                RunState.FAILED,
                RunState.CANCELLED,
                RunState.PAUSED,
            ):
                values["finished_at"] = now
            conn.execute(update(_runs).where(_runs.c.id == run_id).values(**values))
            if target == RunState.CANCELLED:  # nothing is left orphaned
                conn.execute(
                    update(_items)
                    .where(_items.c.run_id == run_id, _items.c.state == ItemState.PENDING)
                    .values(state=ItemState.CANCELLED, finished_at=now)
                )

    def heartbeat(self, run_id: str) -> None:
        with tx.write(self.engine) as conn:
            conn.execute(update(_runs).where(_runs.c.id == run_id).values(heartbeat_at=utcnow()))

    def run_items(self, run_id: str, states: Iterable[str] | None = None) -> list[Item]:
        query = select(_items).where(_items.c.run_id == run_id)
        if states is not None:
            query = query.where(_items.c.state.in_(list(states)))
        with tx.read(self.engine) as conn:
            rows = conn.execute(query.order_by(_items.c.position, _items.c.part)).all()
        return [_item(row) for row in rows]

    def get_item(self, item_pk: int) -> Item:
        with tx.read(self.engine) as conn:
            return _item(conn.execute(select(_items).where(_items.c.id == item_pk)).one())

    def counts(self, run_id: str) -> RunCounts:
        with tx.read(self.engine) as conn:
            states: dict[str, int] = {
                row[0]: int(row[1])
                for row in conn.execute(
                    select(_items.c.state, func.count())
                    .where(_items.c.run_id == run_id)
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

    def fail_running_items(self, run_id: str, error_text: str) -> int:
        """Mark the run's still-running items failed (interrupt, cancellation)."""
        with tx.write(self.engine) as conn:
            return conn.execute(
                update(_items)
                .where(_items.c.run_id == run_id, _items.c.state == ItemState.RUNNING)
                .values(state=ItemState.FAILED, error_text=error_text, finished_at=utcnow())
            ).rowcount

    # ------------------------------------------------------------------ items and the ledger
    def set_item_state(
        self, item_pk: int, target: ItemState, error_text: str | None = None
    ) -> None:
        now = utcnow()
        with tx.write(self.engine) as conn:
            current = conn.execute(
                select(_items.c.state).where(_items.c.id == item_pk)
            ).scalar_one()
            check_item_transition(current, target)
            values: dict[str, Any] = {"state": target, "error_text": error_text}
            if target == ItemState.RUNNING:
                values["started_at"] = now
            else:
                values["finished_at"] = now
            conn.execute(update(_items).where(_items.c.id == item_pk).values(**values))

    def open_submission(self, item_pk: int) -> Submission | None:
        with tx.read(self.engine) as conn:
            row = conn.execute(
                select(_subs)
                .where(
                    _subs.c.item_pk == item_pk,
                    _subs.c.state.in_([s.value for s in OPEN_SUBMISSION_STATES]),
                )
                .order_by(_subs.c.id.desc())
                .limit(1)
            ).first()
        return None if row is None else _submission(row)

    def begin_submission(
        self, item: Item, run_id: str, profile: str, forced: bool, *, start_item: bool = False
    ) -> Submission:
        """Commit the intent of a paid call (and count the attempt) before making it."""
        now = utcnow()
        with tx.write(self.engine) as conn:
            if start_item:  # the item's start and its first intent in one transaction
                current = conn.execute(
                    select(_items.c.state).where(_items.c.id == item.pk)
                ).scalar_one()
                check_item_transition(current, ItemState.RUNNING)
                conn.execute(
                    update(_items)
                    .where(_items.c.id == item.pk)
                    .values(state=ItemState.RUNNING, started_at=now, error_text=None)
                )
            attempt = conn.execute(
                update(_items)
                .where(_items.c.id == item.pk)
                .values(attempts=_items.c.attempts + 1, force_resubmit=False)
                .returning(_items.c.attempts)
            ).scalar_one()
            client_reference = f"{item.idempotency_key}-{attempt}"
            pk = conn.execute(
                insert(_subs)
                .values(
                    item_pk=item.pk,
                    run_id=run_id,
                    attempt=attempt,
                    client_reference=client_reference,
                    provider_profile=profile,
                    state=SubmissionState.INTENT,
                    forced=forced,
                    created_at=now,
                )
                .returning(_subs.c.id)
            ).scalar_one()
        return Submission(pk, item.pk, attempt, client_reference, SubmissionState.INTENT, None)

    def accept_submission(self, submission_pk: int, remote_ref: str) -> None:
        with tx.write(self.engine) as conn:
            conn.execute(
                update(_subs)
                .where(_subs.c.id == submission_pk)
                .values(state=SubmissionState.ACCEPTED, remote_ref=remote_ref, accepted_at=utcnow())
            )

    def close_submission(self, submission_pk: int, state: SubmissionState, error_text: str) -> None:
        with tx.write(self.engine) as conn:
            conn.execute(
                update(_subs)
                .where(_subs.c.id == submission_pk)
                .values(state=state, error_text=error_text[:2000], finished_at=utcnow())
            )

    def complete_item(
        self,
        item_pk: int,
        submission_pk: int,
        episode_pk: int,
        output_path: str,
        sha256: str,
        cost_minor: int,
        currency: str,
    ) -> None:
        """Outcome, cost and item completion in one transaction."""
        now = utcnow()
        with tx.write(self.engine) as conn:
            current = conn.execute(
                select(_items.c.state).where(_items.c.id == item_pk)
            ).scalar_one()
            check_item_transition(current, ItemState.COMPLETED)
            conn.execute(
                update(_subs)
                .where(_subs.c.id == submission_pk)
                .values(state=SubmissionState.SUCCEEDED, finished_at=now)
            )
            conn.execute(
                insert(_costs).values(
                    episode_pk=episode_pk,
                    submission_pk=submission_pk,
                    amount_minor=cost_minor,
                    currency=currency,
                    recorded_at=now,
                )
            )
            conn.execute(
                update(_items)
                .where(_items.c.id == item_pk)
                .values(
                    state=ItemState.COMPLETED,
                    output_path=output_path,
                    output_sha256=sha256,
                    error_text=None,
                    finished_at=now,
                )
            )

    def episode_cost(self, episode_pk: int) -> int:
        with tx.read(self.engine) as conn:
            return int(
                conn.execute(
                    select(func.coalesce(func.sum(_costs.c.amount_minor), 0)).where(
                        _costs.c.episode_pk == episode_pk
                    )
                ).scalar_one()
            )

    def is_stale(self, started_at: datetime | None, stale_after_s: float) -> bool:
        return started_at is None or started_at < utcnow() - timedelta(seconds=stale_after_s)


def _chunks(values: list[str], size: int) -> Iterable[list[str]]:
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
    )


def _item(row: Any) -> Item:
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
    )


def _submission(row: Any) -> Submission:
    return Submission(
        row.id, row.item_pk, row.attempt, row.client_reference, row.state, row.remote_ref
    )


def completed_outputs(engine: Engine, episode_pk: int) -> list[dict[str, Any]]:
    """Completed items of an episode with the remote ref and cost of their paid call."""
    with tx.read(engine) as conn:
        rows = conn.execute(
            select(
                _items.c.idempotency_key,
                _items.c.video_id,
                _items.c.part,
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
            .order_by(_items.c.position, _items.c.part)
        ).all()
    return [dict(row._mapping) for row in rows]
