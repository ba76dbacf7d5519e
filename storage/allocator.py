"""Retry-safe episode allocation (DESIGN section 3).

Under the pipeline lock, in one transaction:

1. read the episodes of the pipeline that carry this allocation key;
2. exactly one, in the requested week -> return it (``created=False``);
3. one in another week, or more than one -> ``AllocationConflict``, nothing changes;
4. otherwise ``sequence = max(sequence in week) + 1`` (0 for a new week), insert the episode
   and an ``allocated`` history event, commit, return it (``created=True``).

The unique constraints on ``(pipeline, allocation_key)`` and ``(pipeline, week_id, sequence)``
are the backstop, not the mechanism.
"""

from __future__ import annotations

from sqlalchemy import Engine, Table, bindparam, func, insert, select

from core.episodes import Allocation, Episode
from core.errors import AllocationConflict
from core.ids import EpisodeId, WeekId
from core.keys import validate_key
from core.settings import validate_pipeline
from storage.base import utcnow
from storage.lock import LOCK_TIMEOUT_S, locked_transaction
from storage.models import EpisodeEventRow, EpisodeRow
from storage.tx import retry_outages

_episodes: Table = EpisodeRow.__table__  # type: ignore[assignment]
_events: Table = EpisodeEventRow.__table__  # type: ignore[assignment]

# Statements are built once: constructing them per call cost more than executing them.
_OWNED = select(
    _episodes.c.week_id, _episodes.c.sequence, _episodes.c.state, _episodes.c.created_at
).where(
    _episodes.c.pipeline == bindparam("pipeline"),
    _episodes.c.allocation_key == bindparam("allocation_key"),
)
_HIGHEST = select(func.max(_episodes.c.sequence)).where(
    _episodes.c.pipeline == bindparam("pipeline"), _episodes.c.week_id == bindparam("week_id")
)
_INSERT_EPISODE = insert(_episodes).returning(_episodes.c.id)
_INSERT_EVENT = insert(_events)


@retry_outages
class Allocator:
    def __init__(self, engine: Engine, *, lock_timeout: float = LOCK_TIMEOUT_S) -> None:
        self._engine = engine
        self._lock_timeout = lock_timeout

    def allocate(self, pipeline: str, week: WeekId, allocation_key: str) -> Allocation:
        validate_pipeline(pipeline)
        validate_key(allocation_key)
        with locked_transaction(self._engine, pipeline, self._lock_timeout) as conn:
            owned = conn.execute(
                _OWNED, {"pipeline": pipeline, "allocation_key": allocation_key}
            ).all()
            if len(owned) > 1:
                ids = ", ".join(f"{row.week_id}-{row.sequence}" for row in owned)
                raise AllocationConflict(
                    f"allocation key {allocation_key!r} owns several episodes ({ids}); refusing"
                )
            if owned:
                row = owned[0]
                if row.week_id != str(week):
                    raise AllocationConflict(
                        f"allocation key {allocation_key!r} already owns episode "
                        f"{row.week_id}-{row.sequence} in {row.week_id}, not {week}; "
                        "nothing was written"
                    )
                episode = Episode(
                    pipeline,
                    EpisodeId(week, row.sequence),
                    allocation_key,
                    row.state,
                    row.created_at,
                )
                return Allocation(episode, created=False)

            highest = conn.execute(_HIGHEST, {"pipeline": pipeline, "week_id": str(week)}).scalar()
            episode_id = EpisodeId(week, 0 if highest is None else highest + 1)
            now = utcnow()
            pk = conn.execute(
                _INSERT_EPISODE,
                {
                    "pipeline": pipeline,
                    "week_id": str(week),
                    "sequence": episode_id.sequence,
                    "episode_id": str(episode_id),
                    "allocation_key": allocation_key,
                    "state": "allocated",
                    "created_at": now,
                    "updated_at": now,
                },
            ).scalar_one()
            conn.execute(
                _INSERT_EVENT,
                {
                    "episode_pk": pk,
                    "kind": "allocated",
                    "at": now,
                    "detail": {"allocation_key": allocation_key},
                },
            )
            return Allocation(
                Episode(pipeline, episode_id, allocation_key, "allocated", now), created=True
            )
