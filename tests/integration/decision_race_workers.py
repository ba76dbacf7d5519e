"""Worker for the decision races, run in separate OS processes (spawn)
released together by `race_workers.run_processes`'s barrier. Returns plain data."""

from __future__ import annotations

import traceback
from typing import Any


def pick_worker(
    barrier: Any,
    url: str,
    episode_ids: list[str],
    by: str,
    decision: str,
    picks: dict[str, int] | None,
    results: Any,
) -> None:
    """Per trial: decide one generated episode (`decision` "approve" with `picks`, or
    "reject") at the same moment as another process; answers (episode, outcome, message)."""
    from episodic.core.errors import CommandNotAllowed
    from episodic.pipeline.approval import decide
    from episodic.storage.engine import make_engine

    engine = make_engine(url)
    out: list[Any] = []
    for episode_id in episode_ids:
        barrier.wait(timeout=120)
        try:
            result = decide(
                engine,
                "weekly",
                episode_id,
                approve=decision == "approve",
                by=by,
                note=None if decision == "approve" else "no",
                picks=picks,
            )
            out.append([episode_id, "recorded" if result["changed"] else "no-op", ""])
        except CommandNotAllowed as exc:
            out.append([episode_id, "refused", str(exc)])
        except Exception:
            out.append([episode_id, "error", traceback.format_exc(limit=3)])
    engine.dispose()
    results.put(out)
