"""A schedule slot's ISO week in the pipeline's timezone, at the edges."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from episodic.core.errors import InvalidInput, InvalidWeekId, NoInvocationIdentity
from episodic.core.ids import WeekId
from episodic.core.keys import slot_key
from episodic.core.schedule_slots import allocation_week, in_week, slot_week, week_window

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")
TOKYO = ZoneInfo("Asia/Tokyo")


@pytest.mark.parametrize(
    ("moment", "week"),
    [
        (datetime(2025, 12, 28, 12, tzinfo=UTC), "2025-W52"),  # a Sunday: 2025's last week
        (datetime(2025, 12, 29, 0, tzinfo=UTC), "2026-W01"),  # Monday: 2026-W01 starts in 2025
        (datetime(2026, 12, 31, 12, tzinfo=UTC), "2026-W53"),  # 2026 has 53 weeks
        (datetime(2027, 1, 3, 23, 59, 59, tzinfo=UTC), "2026-W53"),  # 2027's first days too
        (datetime(2027, 1, 4, 0, tzinfo=UTC), "2027-W01"),
    ],
)
def test_the_year_boundary(moment: datetime, week: str) -> None:
    assert str(slot_week(moment, UTC)) == week
    assert str(allocation_week(slot_key("weekly", moment), UTC).week) == week


def test_a_slot_at_23_30_local_is_in_the_local_days_week() -> None:
    """Sunday 23:30 in New York is Monday 03:30 UTC: the slot is in Sunday's week there."""
    sunday_night = datetime(2026, 8, 9, 23, 30, tzinfo=NEW_YORK)
    key = slot_key("weekly", sunday_night)
    assert key == "slot:weekly:2026-08-10T03:30:00Z"
    found = allocation_week(key, NEW_YORK)
    assert str(found.week) == "2026-W32" and found.moment == sunday_night
    assert found.moment is not None and found.moment.tzinfo == NEW_YORK
    assert str(allocation_week(key, UTC).week) == "2026-W33"
    # east of UTC the other way round: Monday 00:30 in Tokyo is Sunday 15:30 UTC
    monday_early = datetime(2026, 8, 10, 0, 30, tzinfo=TOKYO)
    assert str(allocation_week(slot_key("weekly", monday_early), TOKYO).week) == "2026-W33"
    assert str(allocation_week(slot_key("weekly", monday_early), UTC).week) == "2026-W32"


def test_the_year_boundary_in_a_timezone() -> None:
    """Sunday 2027-01-03 23:30 in Berlin is still 2026-W53 there (22:30 UTC); Monday 00:30
    in Berlin is 2027-W01 while UTC still says 2026-W53."""
    assert str(slot_week(datetime(2027, 1, 3, 23, 30, tzinfo=BERLIN), BERLIN)) == "2026-W53"
    monday = datetime(2027, 1, 4, 0, 30, tzinfo=BERLIN)
    assert str(slot_week(monday, BERLIN)) == "2027-W01"
    assert str(slot_week(monday, UTC)) == "2026-W53"


@pytest.mark.parametrize(
    ("week", "hours", "last_sunday"),
    [
        ("2026-W13", 167, datetime(2026, 3, 29, 23, 30)),  # summer time begins that Sunday
        ("2026-W43", 169, datetime(2026, 10, 25, 23, 30)),  # and ends on this one
    ],
)
def test_a_dst_change_week(week: str, hours: int, last_sunday: datetime) -> None:
    start, end = week_window(WeekId.parse(week), BERLIN)
    assert (start.hour, start.minute, start.weekday()) == (0, 0, 0)
    assert (end.astimezone(UTC) - start.astimezone(UTC)) == timedelta(hours=hours)
    slot = last_sunday.replace(tzinfo=BERLIN)
    assert in_week(slot, WeekId.parse(week), BERLIN)
    assert str(allocation_week(slot_key("weekly", slot), BERLIN).week) == week
    after = end.astimezone(UTC)  # the next Monday 00:00 local: the next week
    assert not in_week(after, WeekId.parse(week), BERLIN)
    assert not in_week(after - timedelta(seconds=1), WeekId.parse(week).next(), BERLIN)


def test_the_repeated_hour_of_the_dst_end_is_one_week() -> None:
    first = datetime(2026, 10, 25, 2, 30, tzinfo=BERLIN, fold=0)
    second = datetime(2026, 10, 25, 2, 30, tzinfo=BERLIN, fold=1)
    assert slot_key("weekly", first) != slot_key("weekly", second)  # two slots an hour apart
    assert {str(allocation_week(slot_key("weekly", m), BERLIN).week) for m in (first, second)} == {
        "2026-W43"
    }


def test_a_slot_key_wins_and_refuses_another_stated_week() -> None:
    key = slot_key("weekly", datetime(2026, 8, 6, 9, tzinfo=UTC))
    same = allocation_week(key, UTC, stated=WeekId.parse("2026-W32"))
    assert str(same.week) == "2026-W32"
    with pytest.raises(InvalidInput, match=r"--key slot:weekly:.* names a slot of 2026-W32"):
        allocation_week(key, UTC, stated=WeekId.parse("2026-W33"), key_name="--key")


def test_other_keys_take_the_stated_week_then_the_moment() -> None:
    stated = allocation_week("flow-run:x", BERLIN, stated=WeekId.parse("2026-W40"))
    assert str(stated.week) == "2026-W40" and stated.moment is None
    start = datetime(2026, 8, 9, 22, 30, tzinfo=UTC)  # Monday 00:30 in Berlin
    manual = allocation_week("flow-run:x", BERLIN, moment=start)
    assert str(manual.week) == "2026-W33" and manual.moment == start
    with pytest.raises(NoInvocationIdentity):
        allocation_week("flow-run:x", BERLIN)


def test_a_naive_moment_has_no_week() -> None:
    with pytest.raises(InvalidWeekId):
        slot_week(datetime(2026, 8, 6, 9), BERLIN)
