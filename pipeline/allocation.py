"""The allocation use case, shared by the CLI and the Prefect task.

Transient database trouble (a lock wait that timed out, a dropped connection) is retried with
tenacity; an `AllocationConflict` is a decision, never retried.
"""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

from filelock import Timeout as FileLockTimeout
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError, OperationalError
from tenacity import (
    retry,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential_jitter,
)

from core.episodes import Allocation
from core.ids import WeekId
from storage.allocator import Allocator


def is_transient_db_error(exc: BaseException) -> bool:
    if isinstance(exc, FileLockTimeout | OperationalError):
        return True
    return isinstance(exc, DBAPIError) and exc.connection_invalidated


def resolve_week(week: str | None, at: datetime | None, tz: ZoneInfo) -> WeekId:
    """The week of an allocation: given outright, or the ISO week of a moment in ``tz``."""
    if week is not None:
        return WeekId.parse(week)
    if at is None:
        raise ValueError("either a week or a moment is required")
    return WeekId.of(at, tz)


@retry(
    retry=retry_if_exception(is_transient_db_error),
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
