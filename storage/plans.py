"""Recorded plans: recording one (with the episode's state change it causes), the newest plan,
and the planning reads.

Planning reads are set-based: a few queries for all items of an episode, however many there
are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, Table, insert, select

from episodic.core.errors import frozen_plan
from episodic.core.runs import ItemSnapshot
from episodic.core.states import FROZEN_PLAN_STATES, EpisodeState, ItemState
from episodic.storage import predicates, tx
from episodic.storage.base import utcnow
from episodic.storage.episodes import move_episode
from episodic.storage.models import (
    EpisodePlanRow,
    EpisodeRow,
    ItemRow,
    ReferenceImageRow,
    SubmissionRow,
)
from episodic.storage.provider_outputs import gone_items
from episodic.storage.tx import retry_outages

_episodes: Table = EpisodeRow.__table__  # type: ignore[assignment]
_plans: Table = EpisodePlanRow.__table__  # type: ignore[assignment]
_items: Table = ItemRow.__table__  # type: ignore[assignment]
_subs: Table = SubmissionRow.__table__  # type: ignore[assignment]
_images: Table = ReferenceImageRow.__table__  # type: ignore[assignment]

_COMPLETED = ItemSnapshot(ItemState.COMPLETED, 0, None, None)


@dataclass(frozen=True, slots=True)
class PlanRecord:
    """A plan to record: the playlist (as JSON), its hash, the reference assets' hashes, where
    it came from, and its reference image (sha256, media type, bytes) if it has one."""

    playlist: dict[str, Any]
    sha256: str
    references: list[str]
    source: str | None
    reference_image: tuple[str, str, bytes] | None = None


class ItemIndex:
    """Snapshots of an episode's items by idempotency key (completed ones kept as bare keys)."""

    def __init__(self, completed: set[str], others: dict[str, ItemSnapshot]) -> None:
        self._completed = completed
        self._others = others

    def get(self, key: str) -> ItemSnapshot | None:
        return _COMPLETED if key in self._completed else self._others.get(key)


@retry_outages
class PlanStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

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
            return record_plan_in(conn, episode_pk, record)[1]

    def latest_plan(self, episode_pk: int) -> tuple[dict[str, Any], list[str]] | None:
        recorded = self.current_plan(episode_pk)
        return None if recorded is None else (recorded[1], recorded[2])

    def current_plan(self, episode_pk: int) -> tuple[int, dict[str, Any], list[str]] | None:
        """The newest recorded plan: (its row id, playlist, reference hashes), or None."""
        with tx.read(self.engine) as conn:
            return newest_plan(conn, episode_pk)

    def reference_image(self, sha256: str) -> tuple[str, bytes] | None:
        """A plan's reference image: (media type, bytes), or None if none is recorded."""
        with tx.read(self.engine) as conn:
            row = conn.execute(
                select(_images.c.media_type, _images.c.content).where(_images.c.sha256 == sha256)
            ).first()
        return None if row is None else (str(row.media_type), bytes(row.content))

    def snapshots(self, episode_pk: int) -> ItemIndex:
        """Every item of the episode, set-based: four queries however many items there are.

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
                        _subs.c.state.in_(predicates.OPEN),
                    )
                )
            }
            gone = gone_items(conn, episode_pk)
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
                row.id in gone,
            )
            for row in rows
        }
        return ItemIndex(completed, others)


def newest_plan(conn: Connection, episode_pk: int) -> tuple[int, dict[str, Any], list[str]] | None:
    """`PlanStore.current_plan` in the caller's transaction (a snapshot's reader)."""
    row = conn.execute(
        select(_plans.c.id, _plans.c.playlist, _plans.c.reference_sha256).where(
            _plans.c.id == predicates.newest_plan(episode_pk).scalar_subquery()
        )
    ).first()
    return None if row is None else (int(row[0]), dict(row[1]), list(row[2]))


def record_plan_in(conn: Connection, episode_pk: int, record: PlanRecord) -> tuple[int, bool]:
    """`PlanStore.record_plan` inside `conn`'s transaction: (the newest plan's id, whether
    this call stored it). Raises `CommandNotAllowed` for a frozen plan."""
    state = conn.execute(
        select(_episodes.c.state).where(_episodes.c.id == episode_pk).with_for_update()
    ).scalar_one()
    if state in FROZEN_PLAN_STATES:
        episode_id = conn.execute(
            select(_episodes.c.episode_id).where(_episodes.c.id == episode_pk)
        ).scalar_one()
        raise frozen_plan(episode_id, state)
    latest = conn.execute(
        select(_plans.c.id, _plans.c.playlist_sha256, _plans.c.reference_sha256).where(
            _plans.c.id == predicates.newest_plan(episode_pk).scalar_subquery()
        )
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
