"""Which period a paid call's money belongs to: the one date rule that `episodic spend` and
the period budgets (in the claim) both use, so the report and the budgets always agree.

A paid call is dated by its submission's ``created_at`` (the moment its intent was
committed), read on a wall clock in the pipeline's timezone. A week is an ISO week (Monday
00:00 to the next Monday 00:00, labelled ``2026-W49``, its ISO year as episodes' week ids);
a month is a calendar month (labelled ``2026-12``); a day (for ``--since``/``--until``) is a
calendar day. A period's bounds are UTC instants, start inclusive and end exclusive, so a
moment is in the period exactly when ``start <= moment < end`` and then
``period_label(kind, moment, tz)`` is that period's label.

A local midnight that a DST change skips (clocks jump from 23:59 to 01:00) starts its day
at the first instant that day's wall clock shows; one that occurs twice starts at the
first. Pure: no database, no clock, no Prefect.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, tzinfo
from typing import Literal, get_args

from episodic.core.ids import WeekId

PeriodKind = Literal["week", "month"]
PERIOD_KINDS: tuple[PeriodKind, ...] = get_args(PeriodKind)


def _local_date(moment: datetime, tz: tzinfo) -> date:
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"a moment needs a timezone to have a period: {moment.isoformat()}")
    return moment.astimezone(tz).date()


def day_start(day: date, tz: tzinfo) -> datetime:
    """The first instant (UTC) whose wall clock in `tz` shows `day`."""
    local = datetime(day.year, day.month, day.day, tzinfo=tz)  # fold=0: the earlier one
    start = local.astimezone(UTC)
    # In a DST gap at midnight, fold=0 reads 00:00 with the offset before the jump: that
    # instant is the jump itself, the first one of `day`. Guard the rule anyway.
    if start.astimezone(tz).date() < day:  # pragma: no cover - no zone does this today
        start = (local + timedelta(hours=1)).astimezone(UTC)
    return start


def _first_day(kind: PeriodKind, local_day: date) -> date:
    if kind == "week":
        return local_day - timedelta(days=local_day.weekday())
    if kind == "month":
        return local_day.replace(day=1)
    raise ValueError(f"unknown period kind {kind!r} (expected one of {', '.join(PERIOD_KINDS)})")


def _next_first_day(kind: PeriodKind, first: date) -> date:
    if kind == "week":
        return first + timedelta(days=7)
    if first.month == 12:
        return date(first.year + 1, 1, 1)
    return date(first.year, first.month + 1, 1)


def period_bounds(kind: PeriodKind, moment: datetime, tz: tzinfo) -> tuple[datetime, datetime]:
    """(start, end) in UTC of the week or month containing `moment` in `tz`; start
    inclusive, end exclusive. A naive `moment` is refused (ValueError): its period is
    ambiguous."""
    first = _first_day(kind, _local_date(moment, tz))
    return day_start(first, tz), day_start(_next_first_day(kind, first), tz)


def period_label(kind: PeriodKind, moment: datetime, tz: tzinfo) -> str:
    """'2026-W49' (ISO week, ISO year) or '2026-12' (calendar month) of `moment` in `tz`."""
    local_day = _local_date(moment, tz)
    if kind == "week":
        iso = local_day.isocalendar()
        return str(WeekId(iso.year, iso.week))
    if kind == "month":
        return f"{local_day.year:04d}-{local_day.month:02d}"
    raise ValueError(f"unknown period kind {kind!r} (expected one of {', '.join(PERIOD_KINDS)})")
