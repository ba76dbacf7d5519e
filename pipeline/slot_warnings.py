"""Slots of a pipeline that more than one deployment asked for (`episodic check`'s
schedule warnings): each slot is still one episode, paid once, but two deployments of the
weekly flow scheduling one pipeline (a copy, a renamed one left behind) is a mistake to fix.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine

from episodic.core.ids import EpisodeId
from episodic.core.keys import SlotKey
from episodic.pipeline.check import Finding
from episodic.storage.allocator import SLOT_EVENTS, asked_by
from episodic.storage.audit import SlotEpisode, snapshot


def schedule_warnings(
    engine: Engine, pipeline: str, episode_id: str | None = None
) -> list[Finding]:
    """Slots of the pipeline that more than one deployment asked for: two deployments of
    the weekly flow schedule one pipeline (a copy, a renamed one left behind). Each slot is
    still one episode, paid once; the warning says which deployments to keep one of. From
    the database alone: the deployments the allocation recorded (`episodic.storage.allocator`) and
    those old-format keys name. With `episode_id`, the slots of that episode only."""
    wanted = None if episode_id is None else str(EpisodeId.parse(episode_id))
    with snapshot(engine) as reader:
        slots: dict[str, list[SlotEpisode]] = {}
        for row in reader.slot_episodes(pipeline):
            if (named := SlotKey.parse(row.allocation_key)) is not None:
                slots.setdefault(named.slot, []).append(row)
        pks = [row.id for rows in slots.values() for row in rows]
        events = reader.slot_events(pks, SLOT_EVENTS)  # every slot event of the pipeline
    asked: dict[int, list[dict[str, Any]]] = {}
    for pk, detail in events:
        asked.setdefault(pk, []).append(detail)
    out: list[Finding] = []
    for slot, rows in slots.items():
        ids = [row.episode_id for row in rows]
        if wanted is not None and wanted not in ids:
            continue
        deployments = sorted(
            set().union(*(asked_by(row.allocation_key, asked.get(row.id, [])) for row in rows))
        )
        if len(deployments) < 2:
            continue
        owned = (
            f"episode {ids[0]}"
            if len(ids) == 1
            else f"episodes {', '.join(ids)} (allocated once per deployment before one "
            "slot meant one episode: `episodic check` of each shows what was paid)"
        )
        out.append(
            Finding(
                ids[0],
                "schedule",
                f"slot {slot} of pipeline {pipeline} was asked for by deployments "
                f"{' and '.join(deployments)} ({owned}): keep one deployment of the weekly "
                "flow per pipeline (`prefect deployment delete FLOW/DEPLOYMENT`)",
            )
        )
    return out
