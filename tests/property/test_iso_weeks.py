"""ISO weeks against the standard library's calendar, for every day 1970-2100, as seen on
the wall clocks of several timezones."""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

import pytest

from episodic.core.ids import EpisodeId, WeekId

ZONES = [
    "UTC",
    "Europe/Berlin",  # DST, midnight is never skipped
    "America/Sao_Paulo",  # DST changes that once fell at midnight
    "Pacific/Kiritimati",  # UTC+14
    "Pacific/Pago_Pago",  # UTC-11
    "Asia/Kathmandu",  # UTC+5:45
]


@pytest.mark.parametrize("zone", ZONES)
def test_every_day_1970_to_2100_is_in_the_stdlib_iso_week(zone: str) -> None:
    tz = ZoneInfo(zone)
    day, last = date(1970, 1, 1), date(2100, 12, 31)
    one = timedelta(days=1)
    previous: WeekId | None = None
    while day <= last:
        year, week, _ = day.isocalendar()
        expected = WeekId(year, week)
        for moment in (time(0, 0, 30), time(12, 0), time(23, 59, 30)):
            local = datetime.combine(day, moment, tzinfo=tz)
            assert WeekId.of(local, tz) == expected, (zone, local)
            # the same instant given in UTC is placed on the zone's wall clock first
            assert WeekId.of(local.astimezone(UTC), tz) == expected, (zone, local)
        assert WeekId.parse(str(expected)) == expected
        if previous is not None and previous != expected:
            assert previous.next() == expected  # weeks follow one another without gaps
        previous = expected
        day += one


@pytest.mark.parametrize("sequence", [0, 1, 9, 10, 99, 999])
def test_episode_ids_round_trip_in_every_week_of_2026(sequence: int) -> None:
    week = WeekId.parse("2026-W01")
    while week.year == 2026:
        episode = EpisodeId(week, sequence)
        assert EpisodeId.parse(str(episode)) == episode
        week = week.next()
