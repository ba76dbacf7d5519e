"""Read access to episodes and their history."""

from __future__ import annotations

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from core.episodes import Episode, EpisodeEvent
from core.errors import EpisodeNotFound
from core.ids import EpisodeId, WeekId
from storage.models import EpisodeRow
from storage.tx import retry_outages


@retry_outages
class EpisodeRepository:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def get(self, pipeline: str, episode_id: EpisodeId) -> Episode:
        with Session(self._engine) as session:
            row = self._row(session, pipeline, episode_id)
            return row.to_domain()

    def locate(self, pipeline: str, episode_id: EpisodeId) -> tuple[Episode, int]:
        """The episode and its row key, in one query."""
        with Session(self._engine) as session:
            row = self._row(session, pipeline, episode_id)
            return row.to_domain(), row.id

    def history(self, pipeline: str, episode_id: EpisodeId) -> list[EpisodeEvent]:
        with Session(self._engine) as session:
            row = self._row(session, pipeline, episode_id)
            return [event.to_domain() for event in row.events]

    def list(self, pipeline: str, week: WeekId | None = None) -> list[Episode]:
        query = select(EpisodeRow).where(EpisodeRow.pipeline == pipeline)
        if week is not None:
            query = query.where(EpisodeRow.week_id == str(week))
        query = query.order_by(EpisodeRow.week_id, EpisodeRow.sequence)
        with Session(self._engine) as session:
            return [row.to_domain() for row in session.scalars(query)]

    @staticmethod
    def _row(session: Session, pipeline: str, episode_id: EpisodeId) -> EpisodeRow:
        row = session.scalars(
            select(EpisodeRow).where(
                EpisodeRow.pipeline == pipeline, EpisodeRow.episode_id == str(episode_id)
            )
        ).one_or_none()
        if row is None:
            raise EpisodeNotFound(pipeline, str(episode_id))
        return row
