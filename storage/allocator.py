"""Retry-safe episode allocation.

Under the pipeline lock, in one transaction:

1. read the episodes of the pipeline that carry this allocation key; for a key naming a
   scheduled slot (``slot:{pipeline}:{utc}``, or the old ``scheduled:{flow}/{deployment}:
   {utc}``) every episode of the pipeline whose key names the same moment, in either
   format, so a slot allocated before the format changed keeps its episode (by lookup: no
   key is rewritten);
2. exactly one, in the requested week -> return it (``created=False``);
3. one in another week, or more than one -> ``AllocationConflict``, nothing changes;
4. otherwise ``sequence = max(sequence in week) + 1`` (0 for a new week), insert the episode
   and an ``allocated`` history event, commit, return it (``created=True``).

A scheduled run names the deployment that asked (``scheduled_by``): it is recorded in the
``allocated`` event, and a deployment that asks for a slot another deployment already holds
is recorded once in a ``slot_requested`` event, so `check` can say from the database alone
that two deployments schedule one pipeline.

The unique constraints on ``(pipeline, allocation_key)`` and ``(pipeline, week_id, sequence)``
are the backstop, not the mechanism.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Engine, Row, Table, bindparam, func, insert, select

from episodic.core.episodes import Allocation, Episode
from episodic.core.errors import AllocationConflict, InvalidInput
from episodic.core.ids import EpisodeId, WeekId
from episodic.core.keys import SlotKey, slot_key, validate_key
from episodic.core.records import EventKind
from episodic.core.settings import validate_pipeline
from episodic.core.states import EpisodeState
from episodic.storage.base import utcnow
from episodic.storage.locks import LOCK_TIMEOUT_S, locked_transaction
from episodic.storage.models import EpisodeEventRow, EpisodeRow
from episodic.storage.tx import retry_outages

_episodes: Table = EpisodeRow.__table__  # type: ignore[assignment]
_events: Table = EpisodeEventRow.__table__  # type: ignore[assignment]

# the events that name who asked for a slot: its allocation, and each later request
SLOT_EVENTS = (EpisodeState.ALLOCATED, EventKind.SLOT_REQUESTED)

# Statements are built once: constructing them per call cost more than executing them.
_COLUMNS = (
    _episodes.c.id,
    _episodes.c.week_id,
    _episodes.c.sequence,
    _episodes.c.state,
    _episodes.c.created_at,
    _episodes.c.allocation_key,
)
_OWNED = select(*_COLUMNS).where(
    _episodes.c.pipeline == bindparam("pipeline"),
    _episodes.c.allocation_key == bindparam("allocation_key"),
)
_OWNED_BY_OLD_KEY = select(*_COLUMNS).where(
    _episodes.c.pipeline == bindparam("pipeline"),
    _episodes.c.allocation_key.like(bindparam("pattern"), escape="\\"),
)
_HIGHEST = select(func.max(_episodes.c.sequence)).where(
    _episodes.c.pipeline == bindparam("pipeline"), _episodes.c.week_id == bindparam("week_id")
)
_ASKED = select(_events.c.detail).where(
    _events.c.episode_pk == bindparam("episode_pk"), _events.c.kind.in_(SLOT_EVENTS)
)
_INSERT_EPISODE = insert(_episodes).returning(_episodes.c.id)
_INSERT_EVENT = insert(_events)


def asked_by(allocation_key: str, details: list[dict[str, Any]]) -> set[str]:
    """The deployments recorded as asking for an episode's slot: those its events name, and
    the one an old-format key names."""
    names = {d["scheduled_by"] for d in details if isinstance(d, dict) and d.get("scheduled_by")}
    slot = SlotKey.parse(allocation_key)
    if slot is not None and slot.deployment is not None:
        names.add(slot.deployment)
    return names


@retry_outages
class Allocator:
    def __init__(self, engine: Engine, *, lock_timeout: float = LOCK_TIMEOUT_S) -> None:
        self._engine = engine
        self._lock_timeout = lock_timeout

    def allocate(
        self,
        pipeline: str,
        week: WeekId,
        allocation_key: str,
        *,
        scheduled_by: str | None = None,
    ) -> Allocation:
        """The episode ``allocation_key`` owns (created if none). ``scheduled_by``: the
        deployment (``flow/deployment``) whose schedule made the asking run, if any."""
        validate_pipeline(pipeline)
        validate_key(allocation_key)
        slot = SlotKey.parse(allocation_key)
        if slot is not None and slot.pipeline is not None and slot.pipeline != pipeline:
            raise InvalidInput(
                f"allocation key {allocation_key!r} is a slot of pipeline {slot.pipeline}, "
                f"not of {pipeline}"
            )
        with locked_transaction(self._engine, pipeline, self._lock_timeout) as conn:
            owned = self._owned(conn, pipeline, allocation_key, slot, scheduled_by)
            if len(owned) > 1:
                ids = ", ".join(
                    f"{row.week_id}-{row.sequence} (key {row.allocation_key})" for row in owned
                )
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
                askers = self._record_asker(conn, row, allocation_key, scheduled_by)
                episode = Episode(
                    pipeline,
                    EpisodeId(week, row.sequence),
                    row.allocation_key,
                    row.state,
                    row.created_at,
                )
                return Allocation(episode, created=False, scheduled_by=tuple(sorted(askers)))
            return self._create(conn, pipeline, week, allocation_key, scheduled_by)

    def owns_episode(self, pipeline: str, allocation_key: str) -> bool:
        """Whether `allocation_key` already owns an episode of `pipeline` (as `allocate` would
        find it: its own key, or another key naming the same slot). Reads only."""
        validate_pipeline(pipeline)
        validate_key(allocation_key)
        slot = SlotKey.parse(allocation_key)
        with self._engine.connect() as conn:
            return bool(self._owned(conn, pipeline, allocation_key, slot))

    @staticmethod
    def _owned(
        conn: Connection,
        pipeline: str,
        allocation_key: str,
        slot: SlotKey | None,
        scheduled_by: str | None = None,
    ) -> list[Row[Any]]:
        """The episodes a key owns: its own, and for a key naming a slot (either format)
        every episode of the pipeline whose key names the same moment.

        A slot that two deployments allocated twice before the slot key existed has two
        episodes; a run of either deployment still finds its own (the one whose old key names
        it, ``scheduled_by``), and only a third asker fails closed."""
        owned = {
            row.id: row
            for row in conn.execute(
                _OWNED, {"pipeline": pipeline, "allocation_key": allocation_key}
            ).all()
        }
        if slot is None:
            return list(owned.values())
        same_slot = conn.execute(
            _OWNED, {"pipeline": pipeline, "allocation_key": slot_key(pipeline, slot.moment)}
        ).all()
        old = conn.execute(
            _OWNED_BY_OLD_KEY, {"pipeline": pipeline, "pattern": slot.legacy_pattern}
        ).all()
        for row in [*same_slot, *old]:  # LIKE found the candidates; the parse decides
            parsed = SlotKey.parse(row.allocation_key)
            if parsed is not None and parsed.moment == slot.moment:
                owned.setdefault(row.id, row)
        found = sorted(owned.values(), key=lambda row: (row.week_id, row.sequence))
        if len(found) > 1:
            exact = [row for row in found if row.allocation_key == allocation_key]
            own = [
                row
                for row in found
                if scheduled_by is not None
                and (parsed := SlotKey.parse(row.allocation_key)) is not None
                and parsed.deployment == scheduled_by
            ]
            for preferred in (exact, own):
                if len(preferred) == 1:
                    return preferred
        return found

    @staticmethod
    def _record_asker(
        conn: Connection, row: Row[Any], allocation_key: str, by: str | None
    ) -> set[str]:
        """The deployments that asked for the episode's slot, ``by`` recorded once per
        deployment and episode (a retry of the same run writes nothing)."""
        details = list(conn.execute(_ASKED, {"episode_pk": row.id}).scalars())
        askers = asked_by(row.allocation_key, details)
        if by is None or by in askers:
            return askers
        conn.execute(
            _INSERT_EVENT,
            {
                "episode_pk": row.id,
                "kind": EventKind.SLOT_REQUESTED,
                "at": utcnow(),
                "detail": {"allocation_key": allocation_key, "scheduled_by": by},
            },
        )
        return askers | {by}

    @staticmethod
    def _create(
        conn: Connection,
        pipeline: str,
        week: WeekId,
        allocation_key: str,
        scheduled_by: str | None,
    ) -> Allocation:
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
        detail: dict[str, Any] = {"allocation_key": allocation_key}
        if scheduled_by is not None:
            detail["scheduled_by"] = scheduled_by
        conn.execute(
            _INSERT_EVENT,
            {"episode_pk": pk, "kind": EpisodeState.ALLOCATED, "at": now, "detail": detail},
        )
        return Allocation(
            Episode(pipeline, episode_id, allocation_key, "allocated", now),
            created=True,
            scheduled_by=() if scheduled_by is None else (scheduled_by,),
        )
