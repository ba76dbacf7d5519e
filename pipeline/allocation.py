"""The allocation use case, shared by the CLI and the Prefect task.

Transient database trouble (a lock wait that timed out, a dropped connection) is retried with
tenacity; an `AllocationConflict` is a decision, never retried.
"""

from __future__ import annotations

from sqlalchemy import Engine
from tenacity import (
    retry,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential_jitter,
)

from episodic.core.episodes import Allocation
from episodic.core.ids import WeekId
from episodic.storage.allocator import Allocator
from episodic.storage.tx import is_transient


@retry(
    retry=retry_if_exception(is_transient),
    stop=stop_after_attempt(4),
    wait=wait_exponential_jitter(multiplier=0.2, max=3.0),
    reraise=True,
)
def allocate(
    engine: Engine,
    pipeline: str,
    week: WeekId,
    allocation_key: str,
    *,
    scheduled_by: str | None = None,
) -> Allocation:
    """``scheduled_by``: the deployment whose schedule made the asking run (recorded)."""
    return Allocator(engine).allocate(pipeline, week, allocation_key, scheduled_by=scheduled_by)
