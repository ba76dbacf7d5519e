"""Episodes planned for the money tests, and what the ledger records as paid: the two things
every budget, cap and recovery test sets up and reads back (the provider's own bill is the
test's server's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text

from episodic.core.ids import WeekId
from episodic.pipeline.allocation import allocate
from episodic.pipeline.episode_plan import record_plan
from tests.generation import write_playlist


def planned_episodes(
    engine: Engine,
    folder: Path,
    count: int,
    items: int,
    *,
    profile: str = "paid",
    prefix: str = "",
    pipeline: str = "weekly",
    **playlist: Any,
) -> list[str]:
    """`count` episodes of `pipeline` in 2026-W32 (keys ``<folder name>-<n>``), each planned
    with `items` items titled ``<prefix>e<n>i<i>`` from `profile`; `playlist` goes to
    `write_playlist` (seeds, parts, ...)."""
    ids = []
    for n in range(count):
        key = f"{folder.name}-{n}"
        episode_id = str(
            allocate(engine, pipeline, WeekId.parse("2026-W32"), key).episode.episode_id
        )
        titles = [f"{prefix}e{n}i{i}" for i in range(items)]
        path = write_playlist(folder / f"pl{n}", titles, profile=profile, **playlist)
        record_plan(engine, pipeline, episode_id, path)
        ids.append(episode_id)
    return ids


def ledger_micros(engine: Engine) -> int:
    """Every cost the ledger records, summed, in micro-units."""
    with engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT COALESCE(SUM(amount_micros), 0) FROM cost_entries")
            ).scalar_one()
        )
