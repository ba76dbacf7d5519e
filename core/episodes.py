"""Domain objects for episodes. ORM rows stay in `storage`; everything above sees these."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from episodic.core.ids import EpisodeId, WeekId


@dataclass(frozen=True, slots=True)
class Episode:
    pipeline: str
    episode_id: EpisodeId
    allocation_key: str
    state: str
    created_at: datetime

    @property
    def week_id(self) -> WeekId:
        return self.episode_id.week

    @property
    def sequence(self) -> int:
        return self.episode_id.sequence

    def to_dict(self) -> dict[str, Any]:
        return {
            "episode_id": str(self.episode_id),
            "week_id": str(self.week_id),
            "sequence": self.sequence,
            "allocation_key": self.allocation_key,
            "pipeline": self.pipeline,
            "state": self.state,
            "created_at": self.created_at.isoformat(),
        }


@dataclass(frozen=True, slots=True)
class Allocation:
    episode: Episode
    created: bool
    # Deployments recorded as scheduling this episode's slot (`flow/deployment`); more than
    # one means two deployments feed one pipeline (`episodic check` warns).
    scheduled_by: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        data = self.episode.to_dict()
        data["created"] = self.created
        return data


@dataclass(frozen=True, slots=True)
class EpisodeEvent:
    kind: str
    at: datetime
    detail: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "at": self.at.isoformat(), "detail": self.detail}
