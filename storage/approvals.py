"""Decisions on an episode's images, and the picks that ship: the approval record."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, Table, insert, select

from episodic.core.states import DECIDED_STATES, EpisodeState
from episodic.storage import tx
from episodic.storage.base import utcnow
from episodic.storage.episodes import move_episode
from episodic.storage.models import ApprovalRow, EpisodeEventRow, EpisodeRow
from episodic.storage.tx import retry_outages

_episodes: Table = EpisodeRow.__table__  # type: ignore[assignment]
_events: Table = EpisodeEventRow.__table__  # type: ignore[assignment]
_approvals: Table = ApprovalRow.__table__  # type: ignore[assignment]


@dataclass(frozen=True)
class RecordedDecision:
    """The latest decision on record: who decided what, when, why, and (an approval of hero
    videos) the picks that ship; `state` is the episode's state when it was read."""

    state: EpisodeState
    decision: EpisodeState  # approved or rejected
    by: str
    note: str | None
    at: datetime
    picks: dict[str, int] = field(default_factory=dict)

    def describe(self) -> str:
        """`rejected by bob at 2026-08-03 09:12 UTC (too dark)`: one clause for a message."""
        text = f"{self.decision} by {self.by} at {self.at:%Y-%m-%d %H:%M} UTC"
        if self.picks:
            text += " with the picks " + ",".join(f"{v}={n}" for v, n in self.picks.items())
        return text + (f" ({self.note})" if self.note else "")


@retry_outages
class ApprovalStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def decide(
        self,
        episode_pk: int,
        approve: bool,
        by: str,
        note: str | None,
        *,
        items: dict[str, str] | None = None,
        picks: dict[str, int] | None = None,
    ) -> RecordedDecision | str | None:
        """Record the decision and move the episode from `generated`, in one transaction.
        `items`: item key -> image sha256 of everything shown; `picks`: video id -> the hero
        candidate that ships (both recorded with the approval).

        Returns None when this decision was recorded; else nothing was written (a concurrent
        decision won the compare-and-set) and the answer is the decision on record, read in
        the same transaction after the winner's commit (or the episode's state, when no
        decision is recorded: it was re-planned meanwhile).
        """
        target = EpisodeState.APPROVED if approve else EpisodeState.REJECTED
        with tx.write(self.engine) as conn:
            detail: dict[str, Any] = {"by": by, "note": note}
            if items is not None:  # the approval record: item key -> sha256 of its image
                detail["items"] = dict(sorted(items.items()))
            if picks:  # hero videos: which candidate ships
                detail["picks"] = dict(picks)
            if not move_episode(conn, episode_pk, target, detail, source=EpisodeState.GENERATED):
                recorded = latest_decision(conn, episode_pk)
                if recorded is not None and recorded.state in DECIDED_STATES:
                    return recorded
                return str(
                    conn.execute(
                        select(_episodes.c.state).where(_episodes.c.id == episode_pk)
                    ).scalar_one()
                )
            conn.execute(
                insert(_approvals).values(
                    episode_pk=episode_pk,
                    decision=target.value,
                    decided_by=by,
                    note=note,
                    decided_at=utcnow(),
                )
            )
        return None

    def approvals(self, episode_pk: int) -> list[dict[str, Any]]:
        with tx.read(self.engine) as conn:
            rows = conn.execute(
                select(_approvals)
                .where(_approvals.c.episode_pk == episode_pk)
                .order_by(_approvals.c.id)
            ).all()
        return [
            {
                "decision": r.decision,
                "by": r.decided_by,
                "note": r.note,
                "at": r.decided_at.isoformat(),
            }
            for r in rows
        ]

    def latest_decision(self, episode_pk: int) -> RecordedDecision | None:
        """The latest decision on record (None: never decided), with the episode's state."""
        with tx.read(self.engine) as conn:
            return latest_decision(conn, episode_pk)

    def approved_items(self, episode_pk: int) -> dict[str, str] | None:
        """The item keys and image sha256 of the latest approval (None: none recorded, e.g.
        an episode approved before approvals recorded them, or migrated)."""
        detail = self._latest_approval(episode_pk)
        if not detail or "items" not in detail:
            return None
        return {str(k): str(v) for k, v in dict(detail["items"]).items()}

    def approved_picks(self, episode_pk: int) -> dict[str, int]:
        """The latest approval's picks: hero video id -> candidate that ships ({}: none)."""
        return approved_picks(self._latest_approval(episode_pk))

    def _latest_approval(self, episode_pk: int) -> dict[str, Any] | None:
        with tx.read(self.engine) as conn:
            return latest_approval(conn, episode_pk)


def approved_picks(detail: dict[str, Any] | None) -> dict[str, int]:
    """The picks of an ``approved`` event's detail (None: no approval): hero video id ->
    candidate that ships ({}: none)."""
    picks = (detail or {}).get("picks") or {}
    return {str(k): int(v) for k, v in dict(picks).items()}


def latest_decision(conn: Connection, episode_pk: int) -> RecordedDecision | None:
    """The episode's latest recorded decision (None: none), read in the caller's
    transaction: its approvals row, and for an approval the picks of its ``approved``
    event."""
    row = conn.execute(
        select(
            _approvals.c.decision,
            _approvals.c.decided_by,
            _approvals.c.note,
            _approvals.c.decided_at,
        )
        .where(_approvals.c.episode_pk == episode_pk)
        .order_by(_approvals.c.id.desc())
        .limit(1)
    ).first()
    if row is None:
        return None
    state = conn.execute(select(_episodes.c.state).where(_episodes.c.id == episode_pk)).scalar_one()
    approved = row.decision == EpisodeState.APPROVED
    picks = approved_picks(latest_approval(conn, episode_pk)) if approved else {}
    return RecordedDecision(
        EpisodeState(state),
        EpisodeState(row.decision),
        str(row.decided_by),
        row.note,
        row.decided_at,
        picks,
    )


def latest_approval(conn: Connection, episode_pk: int) -> dict[str, Any] | None:
    """The detail of the episode's latest ``approved`` event (None: none), read in the
    caller's transaction (a snapshot's reader)."""
    detail = conn.execute(
        select(_events.c.detail)
        .where(_events.c.episode_pk == episode_pk, _events.c.kind == EpisodeState.APPROVED.value)
        .order_by(_events.c.id.desc())
        .limit(1)
    ).scalar()
    return detail if isinstance(detail, dict) else None
