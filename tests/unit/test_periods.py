"""episodic.core.periods: the one date rule of `spend` and the period budgets."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from episodic.core.periods import day_start, period_bounds, period_label

BERLIN = ZoneInfo("Europe/Berlin")
AUCKLAND = ZoneInfo("Pacific/Auckland")
SANTIAGO = ZoneInfo("America/Santiago")  # DST changes at local midnight


def test_week_boundary_in_the_pipelines_timezone() -> None:
    # Sunday 23:30 UTC is Monday 00:30 in Berlin: the next ISO week there, not in UTC
    moment = datetime(2026, 12, 6, 23, 30, tzinfo=UTC)
    assert period_label("week", moment, UTC) == "2026-W49"
    assert period_label("week", moment, BERLIN) == "2026-W50"
    start, end = period_bounds("week", moment, BERLIN)
    assert start == datetime(2026, 12, 6, 23, 0, tzinfo=UTC)
    assert end == datetime(2026, 12, 13, 23, 0, tzinfo=UTC)


def test_month_boundary_and_iso_year() -> None:
    moment = datetime(2026, 12, 31, 12, 0, tzinfo=UTC)  # Jan 1st 01:00 in Auckland
    assert period_label("month", moment, UTC) == "2026-12"
    assert period_label("month", moment, AUCKLAND) == "2027-01"
    assert period_label("week", datetime(2027, 1, 1, 12, tzinfo=UTC), UTC) == "2026-W53"
    start, end = period_bounds("month", moment, AUCKLAND)
    assert start == datetime(2026, 12, 31, 11, 0, tzinfo=UTC)  # NZDT is +13
    assert end == datetime(2027, 1, 31, 11, 0, tzinfo=UTC)


@pytest.mark.parametrize("tz", [UTC, BERLIN, AUCKLAND, SANTIAGO, ZoneInfo("Asia/Kolkata")])
@pytest.mark.parametrize("kind", ["week", "month"])
def test_bounds_and_label_agree_hour_by_hour(kind: str, tz: ZoneInfo) -> None:
    moment = datetime(2025, 12, 20, tzinfo=UTC)
    while moment < datetime(2026, 12, 31, tzinfo=UTC):
        start, end = period_bounds(kind, moment, tz)  # type: ignore[arg-type]
        assert start <= moment < end
        label = period_label(kind, moment, tz)  # type: ignore[arg-type]
        assert period_label(kind, start, tz) == label  # type: ignore[arg-type]
        assert period_label(kind, end - timedelta(microseconds=1), tz) == label  # type: ignore[arg-type]
        assert period_label(kind, end, tz) != label  # type: ignore[arg-type]
        moment += timedelta(hours=5)


def test_day_start_across_dst_midnight() -> None:
    # Santiago springs forward at 00:00 on 2026-09-06: the day starts at the jump (01:00)
    start = day_start(date(2026, 9, 6), SANTIAGO)
    assert start.astimezone(SANTIAGO).date() == date(2026, 9, 6)
    assert (start - timedelta(microseconds=1)).astimezone(SANTIAGO).date() == date(2026, 9, 5)


def test_naive_moment_and_unknown_kind_are_refused() -> None:
    with pytest.raises(ValueError, match="timezone"):
        period_label("week", datetime(2026, 1, 1), UTC)
    with pytest.raises(ValueError, match="period kind"):
        period_bounds("year", datetime(2026, 1, 1, tzinfo=UTC), UTC)  # type: ignore[arg-type]
