"""What an import of the legacy weekly layout (`episodic.pipeline.legacy`) reads and writes.

An imported episode is written whole in one transaction: its run, items, submissions (in
this installation's reference form, the provider profile ``legacy``), costs, media, the
``migrated`` event and its decision. A crash leaves nothing half-imported, and the next
apply (which finds the same allocated episode) imports it whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, func, insert, select

from episodic.core.media import StoredMedia
from episodic.core.playlist import PlannedItem
from episodic.core.records import EventKind
from episodic.core.states import EpisodeState
from episodic.storage import installation, tx
from episodic.storage.episodes import move_episode
from episodic.storage.models import (
    ApprovalRow,
    CostEntryRow,
    EpisodeEventRow,
    EpisodeMediaRow,
    EpisodeRow,
    ItemRow,
    RunRow,
    SubmissionRow,
)


@dataclass(frozen=True, slots=True)
class ImportedImage:
    """One paid image of the legacy system, its file already copied into the media store
    (`stored`: its key, sha256, size and media type)."""

    planned: PlannedItem
    stored: StoredMedia
    remote_ref: str
    cost_micros: int
    currency: str
    completed_at: datetime


@dataclass(frozen=True, slots=True)
class ImportedDecision:
    state: EpisodeState  # approved or rejected
    by: str
    note: str | None
    at: datetime


@dataclass(frozen=True, slots=True)
class ImportedEpisode:
    """Everything one import writes for an allocated episode (`episode_pk`)."""

    episode_pk: int
    run_id: str
    source: str  # the legacy week folder
    started_at: datetime  # when the import ran
    finished_at: datetime  # the legacy completion (the import's moment if none)
    images: list[ImportedImage]
    media: list[tuple[str, StoredMedia]]  # (kind, as copied into the media store)
    migrated: dict[str, Any]  # the ``migrated`` event's detail
    decision: ImportedDecision | None  # None: the legacy episode was never decided


def known_remote_ref(engine: Engine, profile: str, refs: Sequence[str]) -> str | None:
    """One of `refs` (at most 500) already recorded by a submission of `profile`, or None."""
    with tx.read(engine) as conn:
        known = conn.execute(
            select(SubmissionRow.remote_ref)
            .where(
                SubmissionRow.provider_profile == profile,
                SubmissionRow.remote_ref.in_(refs),
            )
            .limit(1)
        ).scalar()
    return None if known is None else str(known)


def imported_episode(engine: Engine, pipeline: str, allocation_key: str) -> str | None:
    """The episode an earlier apply imported under `allocation_key` (its ``migrated``
    event commits with the data), or None."""
    with tx.read(engine) as conn:
        found = conn.execute(
            select(EpisodeRow.episode_id)
            .join(EpisodeEventRow, EpisodeEventRow.episode_pk == EpisodeRow.id)
            .where(
                EpisodeRow.pipeline == pipeline,
                EpisodeRow.allocation_key == allocation_key,
                EpisodeEventRow.kind == EventKind.MIGRATED,
            )
        ).scalar()
    return None if found is None else str(found)


def top_sequence(engine: Engine, pipeline: str, week: str) -> int | None:
    """The highest episode sequence of `week` in the pipeline (None: no episode yet)."""
    with tx.read(engine) as conn:
        top = conn.execute(
            select(func.max(EpisodeRow.sequence)).where(
                EpisodeRow.pipeline == pipeline, EpisodeRow.week_id == week
            )
        ).scalar()
    return None if top is None else int(top)


def record_import(engine: Engine, imported: ImportedEpisode, profile: str) -> None:
    """Write `imported` in one transaction; the episode becomes generated, then (with a
    decision) approved or rejected. `profile`: the provider profile of its submissions."""
    pk, run_id = imported.episode_pk, imported.run_id
    with tx.write(engine) as conn:
        # never sent (the legacy system made these jobs): the reference is recorded in this
        # installation's form, so the column holds one kind of reference
        scope = installation.read(conn)
        conn.execute(
            insert(RunRow).values(
                id=run_id,
                episode_pk=pk,
                command="migrate",
                state="completed",
                params={"source": imported.source},
                created_at=imported.started_at,
                started_at=imported.started_at,
                finished_at=imported.finished_at,
            )
        )
        for image in imported.images:
            _record_image(conn, imported, image, scope, profile)
        for kind, stored in imported.media:
            conn.execute(
                insert(EpisodeMediaRow).values(
                    episode_pk=pk,
                    kind=kind,
                    key=stored.key,
                    sha256=stored.sha256,
                    size=stored.size,
                    media_type=stored.media_type,
                    recorded_at=imported.started_at,
                )
            )
        conn.execute(
            insert(EpisodeEventRow).values(
                episode_pk=pk,
                kind=EventKind.MIGRATED,
                at=imported.started_at,
                detail=imported.migrated,
            )
        )
        move_episode(conn, pk, EpisodeState.GENERATED, {"migrated": True})
        decision = imported.decision
        if decision is not None:
            detail = {"by": decision.by, "note": decision.note, "migrated": True}
            move_episode(conn, pk, decision.state, detail)
            conn.execute(
                insert(ApprovalRow).values(
                    episode_pk=pk,
                    decision=decision.state.value,
                    decided_by=decision.by,
                    note=decision.note,
                    decided_at=decision.at,
                )
            )


def _record_image(
    conn: Connection, imported: ImportedEpisode, image: ImportedImage, scope: str, profile: str
) -> None:
    """One imported image: its completed item, the succeeded submission that made it (the
    reference in this installation's form, `scope`) and its cost."""
    planned = image.planned
    item_pk = conn.execute(
        insert(ItemRow)
        .values(
            episode_pk=imported.episode_pk,
            run_id=imported.run_id,
            idempotency_key=planned.idempotency_key,
            position=planned.index,
            video_id=planned.video_id,
            part=planned.part,
            prompt=planned.prompt,
            seed=0,
            state="completed",
            attempts=1,
            output_key=image.stored.key,
            output_sha256=image.stored.sha256,
            output_size=image.stored.size,
            output_media_type=image.stored.media_type,
            force_resubmit=False,
            created_at=imported.started_at,
            started_at=image.completed_at,
            finished_at=image.completed_at,
        )
        .returning(ItemRow.id)
    ).scalar_one()
    sub_pk = conn.execute(
        insert(SubmissionRow)
        .values(
            item_pk=item_pk,
            run_id=imported.run_id,
            attempt=1,
            client_reference=installation.reference(scope, planned.idempotency_key, 1),
            provider_profile=profile,
            state="succeeded",
            remote_ref=image.remote_ref,
            forced=False,
            created_at=image.completed_at,
            accepted_at=image.completed_at,
            finished_at=image.completed_at,
        )
        .returning(SubmissionRow.id)
    ).scalar_one()
    conn.execute(
        insert(CostEntryRow).values(
            episode_pk=imported.episode_pk,
            submission_pk=sub_pk,
            amount_micros=image.cost_micros,
            currency=image.currency,
            basis="per_image",
            quantity=1,
            unit_price_micros=image.cost_micros,
            recorded_at=image.completed_at,
        )
    )
