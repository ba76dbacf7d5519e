"""ORM rows. They never leave `storage`: repositories turn them into `core` domain objects."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, ForeignKey, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column, relationship

from core.episodes import Episode, EpisodeEvent
from core.ids import EpisodeId, WeekId
from storage.base import Base, utcnow

# BigInteger primary keys that still autoincrement on SQLite (where only INTEGER does).
BigIntPK = BigInteger().with_variant(Integer(), "sqlite")


class EpisodeRow(Base):
    __tablename__ = "episodes"
    __table_args__ = (
        UniqueConstraint("pipeline", "episode_id"),
        UniqueConstraint("pipeline", "allocation_key"),
        UniqueConstraint("pipeline", "week_id", "sequence"),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    pipeline: Mapped[str] = mapped_column(String(63))
    week_id: Mapped[str] = mapped_column(String(8))
    sequence: Mapped[int] = mapped_column(Integer)
    episode_id: Mapped[str] = mapped_column(String(24))
    allocation_key: Mapped[str] = mapped_column(String(512))
    state: Mapped[str] = mapped_column(String(32), default="allocated")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)

    events: Mapped[list[EpisodeEventRow]] = relationship(
        back_populates="episode", order_by="EpisodeEventRow.id"
    )

    def to_domain(self) -> Episode:
        return Episode(
            pipeline=self.pipeline,
            episode_id=EpisodeId(WeekId.parse(self.week_id), self.sequence),
            allocation_key=self.allocation_key,
            state=self.state,
            created_at=self.created_at,
        )


class EpisodeEventRow(Base):
    """Append-only history of an episode."""

    __tablename__ = "episode_events"
    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    episode_pk: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("episodes.id", ondelete="RESTRICT"), index=True
    )
    kind: Mapped[str] = mapped_column(String(32))
    at: Mapped[datetime] = mapped_column(default=utcnow)
    detail: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)

    episode: Mapped[EpisodeRow] = relationship(back_populates="events")

    def to_domain(self) -> EpisodeEvent:
        return EpisodeEvent(kind=self.kind, at=self.at, detail=dict(self.detail or {}))
