"""The read-only snapshot `episodic check` audits (`episodic.pipeline.check`): the rows it reads, as
plain records, each episode's in one snapshot transaction.

Only reads: the statements are the ones the audit has always issued, in the same order. What
the rows mean (a completed item has one succeeded submission, an accepted job is collected,
...) is judged by `episodic.pipeline.check` alone, in its own encodings of the rules.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, exists, select

from episodic.core.records import EventKind
from episodic.storage.admission import DedupPolicy, active_run
from episodic.storage.approvals import latest_approval
from episodic.storage.base import utcnow
from episodic.storage.models import (
    CostEntryRow,
    EpisodeEventRow,
    EpisodeMediaRow,
    EpisodeRow,
    ItemRow,
    LostOutputRow,
    RunRow,
    SubmissionRow,
)
from episodic.storage.plans import newest_plan


@dataclass(frozen=True, slots=True)
class EpisodeRecord:
    id: int
    pipeline: str
    episode_id: str
    week_id: str
    sequence: int
    state: str
    allocation_key: str


@dataclass(frozen=True, slots=True)
class ItemRecord:
    id: int
    idempotency_key: str
    video_id: str
    part: int
    candidate: int | None
    state: str
    output_key: str | None  # in the media store
    output_sha256: str | None
    output_size: int | None
    output_media_type: str | None
    output_path: str | None  # a legacy row's absolute local file (no key)
    lease_expires_at: datetime | None


@dataclass(frozen=True, slots=True)
class SubmissionRecord:
    id: int
    item_pk: int
    state: str
    client_reference: str
    provider_profile: str
    remote_ref: str | None
    output_lost: bool  # its output was recorded lost (`lost_outputs`) and bought again
    reserved_micros: int = 0  # what the caps and budgets counted the call at before its bill


@dataclass(frozen=True, slots=True)
class CostRecord:
    id: int
    submission_pk: int
    amount_micros: int
    currency: str
    basis: str  # with the quantity and unit price: what `check` recomputes the amount from
    quantity: int
    unit_price_micros: int


@dataclass(frozen=True, slots=True)
class MediaRecord:
    kind: str
    key: str | None  # in the media store
    sha256: str
    size: int | None
    media_type: str | None
    path: str | None  # a legacy row's absolute local file (no key)


@dataclass(frozen=True, slots=True)
class RunRecord:
    id: str
    state: str
    active: (
        bool  # `episodic.storage.admission.active_run` when it was read: the choke point's liveness
    )
    created_at: datetime
    started_at: datetime | None
    heartbeat_at: datetime | None
    lease_expires_at: datetime | None


@dataclass(frozen=True, slots=True)
class SlotEpisode:
    id: int
    episode_id: str
    allocation_key: str


@dataclass(frozen=True, slots=True)
class EpisodeAudit:
    """One episode as one moment of the database has it."""

    episode: EpisodeRecord
    items: list[ItemRecord]
    submissions: list[SubmissionRecord]
    costs: list[CostRecord]
    media: list[MediaRecord]
    runs: list[RunRecord]  # its pending and running runs
    migrated: bool  # imported by `migrate-legacy` (a ``migrated`` event)
    latest_event: Any  # detail of its latest event but ``slot_requested`` (None: none)
    plan: tuple[int, dict[str, Any], list[str]] | None  # newest: (id, playlist, references)
    approval: dict[str, Any] | None  # detail of its latest ``approved`` event
    cancel_notes: list[Any]  # details of its ``provider_cancel`` events, oldest first


_Record = TypeVar("_Record")


def _record(kind: type[_Record], row: Any) -> _Record:
    return kind(**{f.name: getattr(row, f.name) for f in dataclasses.fields(kind)})  # type: ignore[arg-type]


def list_episodes(
    engine: Engine, pipeline: str, episode_id: str | None = None
) -> list[EpisodeRecord]:
    """The pipeline's episodes (or the one, an empty list if it does not exist), in week
    and sequence order."""
    with engine.connect() as conn:
        query = select(EpisodeRow).where(EpisodeRow.pipeline == pipeline)
        if episode_id is not None:
            query = query.where(EpisodeRow.episode_id == episode_id)
        rows = conn.execute(query.order_by(EpisodeRow.week_id, EpisodeRow.sequence)).all()
    return [_record(EpisodeRecord, row) for row in rows]


class AuditReader:
    """The reads of one snapshot (`snapshot`)."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def slot_episodes(self, pipeline: str) -> list[SlotEpisode]:
        """Every episode of the pipeline with its allocation key, in week and sequence order."""
        rows = self._conn.execute(
            select(EpisodeRow.id, EpisodeRow.episode_id, EpisodeRow.allocation_key)
            .where(EpisodeRow.pipeline == pipeline)
            .order_by(EpisodeRow.week_id, EpisodeRow.sequence)
        ).all()
        return [_record(SlotEpisode, row) for row in rows]

    def slot_events(
        self, episode_pks: Sequence[int], kinds: Sequence[str]
    ) -> list[tuple[int, Any]]:
        """(episode key, detail) of every event of `kinds` of these episodes, one statement."""
        rows = self._conn.execute(
            select(EpisodeEventRow.episode_pk, EpisodeEventRow.detail).where(
                EpisodeEventRow.episode_pk.in_(episode_pks), EpisodeEventRow.kind.in_(kinds)
            )
        ).all()
        return [(int(pk), detail) for pk, detail in rows]

    def episode(self, episode_pk: int, policy: DedupPolicy) -> EpisodeAudit:
        """The episode and everything the audit reads of it. `policy`: the pending TTL and
        fallback lease by which its runs' `active` is read."""
        conn = self._conn
        episode = conn.execute(select(EpisodeRow).where(EpisodeRow.id == episode_pk)).one()
        items = conn.execute(select(ItemRow).where(ItemRow.episode_pk == episode_pk)).all()
        subs = conn.execute(
            select(SubmissionRow)
            .add_columns(
                exists().where(LostOutputRow.submission_pk == SubmissionRow.id).label("output_lost")
            )
            .join(ItemRow, ItemRow.id == SubmissionRow.item_pk)
            .where(ItemRow.episode_pk == episode_pk)
        ).all()
        costs = conn.execute(
            select(CostEntryRow).where(CostEntryRow.episode_pk == episode_pk)
        ).all()
        media = conn.execute(
            select(EpisodeMediaRow).where(EpisodeMediaRow.episode_pk == episode_pk)
        ).all()
        runs = _unfinished_runs(conn, episode_pk, policy)
        migrated = conn.execute(
            select(EpisodeEventRow.id).where(
                EpisodeEventRow.episode_pk == episode_pk, EpisodeEventRow.kind == EventKind.MIGRATED
            )
        ).first()
        latest_event = _latest_event(conn, episode_pk)
        plan = newest_plan(conn, episode_pk)
        approval = latest_approval(conn, episode_pk)
        cancel_notes = list(
            conn.execute(
                select(EpisodeEventRow.detail)
                .where(
                    EpisodeEventRow.episode_pk == episode_pk,
                    EpisodeEventRow.kind == EventKind.PROVIDER_CANCEL,
                )
                .order_by(EpisodeEventRow.id)
            ).scalars()
        )
        return EpisodeAudit(
            episode=_record(EpisodeRecord, episode),
            items=[_record(ItemRecord, row) for row in items],
            submissions=[_record(SubmissionRecord, row) for row in subs],
            costs=[_record(CostRecord, row) for row in costs],
            media=[_record(MediaRecord, row) for row in media],
            runs=runs,
            migrated=migrated is not None,
            latest_event=latest_event,
            plan=plan,
            approval=approval,
            cancel_notes=cancel_notes,
        )


def _unfinished_runs(conn: Connection, episode_pk: int, policy: DedupPolicy) -> list[RunRecord]:
    """The episode's pending and running runs, each with the choke point's `active` now."""
    rows = conn.execute(
        select(RunRow, active_run(utcnow(), policy).label("active")).where(
            RunRow.episode_pk == episode_pk, RunRow.state.in_(["pending", "running"])
        )
    ).all()
    return [
        RunRecord(
            id=str(row.id),
            state=str(row.state),
            active=bool(row.active),
            created_at=row.created_at,
            started_at=row.started_at,
            heartbeat_at=row.heartbeat_at,
            lease_expires_at=row.lease_expires_at,
        )
        for row in rows
    ]


def _latest_event(conn: Connection, episode_pk: int) -> Any:
    """The detail of the episode's newest event of what happened to it (a slot request
    says who asked, not what happened: not counted)."""
    return conn.execute(
        select(EpisodeEventRow.detail)
        .where(
            EpisodeEventRow.episode_pk == episode_pk,
            EpisodeEventRow.kind != EventKind.SLOT_REQUESTED,  # who asked, not what happened
        )
        .order_by(EpisodeEventRow.id.desc())
        .limit(1)
    ).scalar()


@contextmanager
def snapshot(engine: Engine) -> Iterator[AuditReader]:
    """One read transaction whose statements all see the same moment: a run working while
    `check` reads must not look like a broken ledger (an item read before its completion and
    its submission after). PostgreSQL: REPEATABLE READ (a snapshot at the first statement);
    SQLite: one transaction (WAL readers keep their snapshot until it ends)."""
    conn = engine.connect()
    if engine.dialect.name == "postgresql":
        conn = conn.execution_options(isolation_level="REPEATABLE READ")
    with conn, conn.begin():
        yield AuditReader(conn)
