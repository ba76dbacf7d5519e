"""Episodes: their reads, and the episode state machine.

An episode changes state in one place, `move_episode`: one guarded statement, recorded in its
history. The moves themselves (generated once every planned image is completed, decided,
assembled, re-planned, reopened) are made by the rooms that decide them, inside their own
transactions, through it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, Table, insert, select
from sqlalchemy.orm import Session

from episodic.core.episodes import Episode, EpisodeEvent
from episodic.core.errors import EpisodeNotFound
from episodic.core.ids import EpisodeId, WeekId
from episodic.core.media import StoredMedia
from episodic.core.states import EpisodeState, ItemState, check_transition, sources_of
from episodic.storage import predicates, statements, tx
from episodic.storage.base import utcnow
from episodic.storage.engine import database_label
from episodic.storage.models import (
    EpisodeEventRow,
    EpisodeMediaRow,
    EpisodePlanRow,
    EpisodeRow,
    ItemRow,
)
from episodic.storage.tx import idempotent, retry_outages

_episodes: Table = EpisodeRow.__table__  # type: ignore[assignment]
_events: Table = EpisodeEventRow.__table__  # type: ignore[assignment]
_items: Table = ItemRow.__table__  # type: ignore[assignment]
_plans: Table = EpisodePlanRow.__table__  # type: ignore[assignment]
_media: Table = EpisodeMediaRow.__table__  # type: ignore[assignment]


@dataclass(frozen=True, slots=True)
class EpisodeMedia:
    """One final medium of an episode as recorded: its media store ``key`` with ``sha256``
    (hex), ``size`` (bytes) and ``media_type``; a row from before the store has no key, size
    or type, only the absolute ``legacy_path`` of its local file."""

    key: str | None
    sha256: str
    size: int | None
    media_type: str | None
    legacy_path: str | None


@retry_outages
class EpisodeRepository:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def get(self, pipeline: str, episode_id: EpisodeId) -> Episode:
        with Session(self.engine) as session:
            row = self._row(session, pipeline, episode_id)
            return row.to_domain()

    def locate(self, pipeline: str, episode_id: EpisodeId) -> tuple[Episode, int]:
        """The episode and its row key, in one query."""
        with Session(self.engine) as session:
            row = self._row(session, pipeline, episode_id)
            return row.to_domain(), row.id

    def history(self, pipeline: str, episode_id: EpisodeId) -> list[EpisodeEvent]:
        with Session(self.engine) as session:
            row = self._row(session, pipeline, episode_id)
            return [event.to_domain() for event in row.events]

    def episode_pk(self, pipeline: str, episode_id: str) -> int:
        with tx.read(self.engine) as conn:
            pk = conn.execute(
                select(_episodes.c.id).where(
                    _episodes.c.pipeline == pipeline, _episodes.c.episode_id == episode_id
                )
            ).scalar()
        if pk is None:
            raise EpisodeNotFound(pipeline, episode_id, database_label(self.engine))
        return int(pk)

    def state(self, episode_pk: int) -> str:
        with tx.read(self.engine) as conn:
            return str(
                conn.execute(
                    select(_episodes.c.state).where(_episodes.c.id == episode_pk)
                ).scalar_one()
            )

    def transition(self, episode_pk: int, target: EpisodeState, detail: dict[str, Any]) -> bool:
        """Move the episode along an allowed transition, with a history event (no-op if there)."""
        with tx.write(self.engine) as conn:
            return move_episode(conn, episode_pk, target, detail)

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
        if not planned_keys:
            return False
        with tx.write(self.engine) as conn:
            state = conn.execute(
                select(_episodes.c.state).where(_episodes.c.id == episode_pk).with_for_update()
            ).scalar_one()
            if plan_id is not None and predicates.newest_plan_id(conn, episode_pk) != plan_id:
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

    def media(self, episode_pk: int) -> dict[str, EpisodeMedia]:
        """The episode's final media (cover, manifest) by kind, as assembly recorded them."""
        with tx.read(self.engine) as conn:
            rows = conn.execute(
                select(
                    _media.c.kind,
                    _media.c.key,
                    _media.c.sha256,
                    _media.c.size,
                    _media.c.media_type,
                    _media.c.path,
                ).where(_media.c.episode_pk == episode_pk)
            ).all()
        return {r.kind: EpisodeMedia(r.key, r.sha256, r.size, r.media_type, r.path) for r in rows}

    def record_media(self, episode_pk: int, media: dict[str, StoredMedia]) -> bool:
        """Record the final media as the store holds them (key, sha256, size, media type;
        no machine path); True if anything changed (reassembly changes nothing)."""
        wanted = {
            kind: EpisodeMedia(m.key, m.sha256, m.size, m.media_type, None)
            for kind, m in media.items()
        }
        if self.media(episode_pk) == wanted:
            return False
        now = utcnow()
        with tx.write(self.engine) as conn:  # an upsert: two assemblies at once never collide
            for kind, stored in media.items():
                values = {
                    "key": stored.key,
                    "sha256": stored.sha256,
                    "size": stored.size,
                    "media_type": stored.media_type,
                    "path": None,  # a legacy row's local file is no longer what ships
                    "recorded_at": now,
                }
                statement = tx.insert_for(conn, _media).values(
                    episode_pk=episode_pk, kind=kind, **values
                )
                conn.execute(
                    statement.on_conflict_do_update(
                        index_elements=["episode_pk", "kind"], set_=values
                    )
                )
        return True

    def list(self, pipeline: str, week: WeekId | None = None) -> list[Episode]:
        query = select(EpisodeRow).where(EpisodeRow.pipeline == pipeline)
        if week is not None:
            query = query.where(EpisodeRow.week_id == str(week))
        query = query.order_by(EpisodeRow.week_id, EpisodeRow.sequence)
        with Session(self.engine) as session:
            return [row.to_domain() for row in session.scalars(query)]

    @staticmethod
    def _row(session: Session, pipeline: str, episode_id: EpisodeId) -> EpisodeRow:
        row = session.scalars(
            select(EpisodeRow).where(
                EpisodeRow.pipeline == pipeline, EpisodeRow.episode_id == str(episode_id)
            )
        ).one_or_none()
        if row is None:
            raise EpisodeNotFound(pipeline, str(episode_id), database_label(session.get_bind()))
        return row


def move_episode(
    conn: Connection,
    episode_pk: int,
    target: EpisodeState,
    detail: dict[str, Any],
    *,
    source: EpisodeState | None = None,
) -> bool:
    """The one place an episode changes state: one guarded statement, recorded in its history.

    ``UPDATE … WHERE state IN (:allowed sources)`` (or exactly `source`): True if this call
    moved it; False if it already is in `target` or, with `source`, is no longer there (a
    concurrent caller won). Any other state is an `InvalidTransition`.
    """
    allowed = [source.value] if source is not None else sources_of("episode", target)
    now = utcnow()
    moved = conn.execute(statements.set_episode_state(episode_pk, allowed, target, now)).rowcount
    if not moved:
        current = conn.execute(
            select(_episodes.c.state).where(_episodes.c.id == episode_pk)
        ).scalar_one()
        if current == target or source is not None:
            return False
        check_transition("episode", current, target)  # raises: not allowed from here
        return False
    conn.execute(
        insert(_events).values(episode_pk=episode_pk, kind=target.value, at=now, detail=detail)
    )
    return True
