"""Workers of the slot races (tests/integration/test_slot_races.py), run in separate OS
processes released together by a barrier (`race_workers.run_processes`)."""

from __future__ import annotations

import traceback
from typing import Any


def slot_worker(barrier: Any, url: str, trials: list[tuple[str, str | None]], results: Any) -> None:
    """Per trial: allocate the slot's key as the named deployment's scheduled run would."""
    from episodic.core.ids import WeekId
    from episodic.pipeline.allocation import allocate
    from episodic.storage.engine import make_engine

    engine = make_engine(url)
    out: list[Any] = []
    for key, scheduled_by in trials:
        barrier.wait(timeout=120)
        try:
            got = allocate(
                engine, "weekly", WeekId.parse("2026-W32"), key, scheduled_by=scheduled_by
            )
            out.append([key, str(got.episode.episode_id), got.created])
        except Exception:
            out.append([key, "error: " + traceback.format_exc(limit=3), False])
    results.put(out)
