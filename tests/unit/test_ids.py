from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from episodic.core.errors import InvalidEpisodeId, InvalidInput, InvalidWeekId
from episodic.core.ids import EpisodeId, WeekId, parse_run_id, weeks_in_iso_year

BERLIN = ZoneInfo("Europe/Berlin")


@pytest.mark.parametrize(
    ("day", "expected"),
    [
        (date(2026, 12, 31), "2026-W53"),
        (date(2027, 1, 1), "2026-W53"),
        (date(2027, 1, 3), "2026-W53"),
        (date(2027, 1, 4), "2027-W01"),
        (date(2026, 8, 7), "2026-W32"),
    ],
)
def test_iso_week_edges(day: date, expected: str) -> None:
    moment = datetime(day.year, day.month, day.day, 12, tzinfo=UTC)
    assert str(WeekId.of(moment, UTC)) == expected


def test_2026_has_53_weeks_and_2027_has_52() -> None:
    assert weeks_in_iso_year(2026) == 53
    assert weeks_in_iso_year(2027) == 52
    assert str(WeekId.parse("2026-W53")) == "2026-W53"
    with pytest.raises(InvalidWeekId, match="52 ISO weeks"):
        WeekId.parse("2027-W53")
    with pytest.raises(InvalidEpisodeId):
        EpisodeId.parse("2027-W53-0")


def test_berlin_monday_half_past_midnight_is_that_mondays_week() -> None:
    monday = datetime(2026, 8, 3, 0, 30, tzinfo=BERLIN)  # Sunday 22:30 in UTC
    assert str(WeekId.of(monday, BERLIN)) == "2026-W32"
    assert str(WeekId.of(monday, UTC)) == "2026-W31"


def test_naive_moment_is_refused() -> None:
    with pytest.raises(InvalidWeekId, match="timezone"):
        WeekId.of(datetime(2026, 8, 3, 9), UTC)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "2026-W32",
        "2026-W32-",
        "2026-W32-01",
        "2026-w32-0",
        "2026-W00-0",
        "2026-W54-0",
        "26-W32-0",
        "2026-W3-0",
        "../2026-W32-0",
        "2026-W32-0/..",
        "2026-W32-0\n",
        " 2026-W32-0",
        "2026-W32--1",
        "2026-W32-+1",
        "\uff12\uff10\uff12\uff16-W32-0"  # fullwidth digits,
        "2026-W32-0x",
        "2026-W32-99999999999",
    ],
)
def test_episode_id_parse_is_strict(text: str) -> None:
    with pytest.raises(InvalidEpisodeId):
        EpisodeId.parse(text)


@given(
    st.dates(min_value=date(1900, 1, 1), max_value=date(9998, 12, 1)),
    st.integers(min_value=0, max_value=10**6),
)
def test_episode_id_round_trips(day: date, sequence: int) -> None:
    iso = day.isocalendar()
    episode = EpisodeId(WeekId(iso.year, iso.week), sequence)
    assert EpisodeId.parse(str(episode)) == episode


@given(st.text(max_size=24))
def test_parse_accepts_only_canonical_text(text: str) -> None:
    try:
        parsed = EpisodeId.parse(text)
    except InvalidEpisodeId:
        return
    assert str(parsed) == text  # whatever parses is its own canonical form (no path tricks)


def test_next_week_crosses_iso_years() -> None:
    assert str(WeekId.parse("2026-W53").next()) == "2027-W01"
    assert WeekId.parse("2026-W53").monday() + timedelta(weeks=1) == date(2027, 1, 4)


@pytest.mark.parametrize("text", ["x" * 5000, "2026-W32-" + "9" * 5000])
def test_an_overlong_id_is_clipped_in_its_one_line_error(text: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        EpisodeId.parse(text)
    message = str(caught.value)
    assert "\n" not in message and len(message) < 200 and f"({len(text)} chars)" in message


def test_run_ids_are_parsed_strictly() -> None:
    run = "0d45478b-098c-4a4a-9a52-0d9ecb6a88ed"
    assert parse_run_id(run.upper()) == run
    for bad in ("", "no-such-run", "x" * 5000, run + "\n", 7):
        with pytest.raises(InvalidInput):
            parse_run_id(bad)  # type: ignore[arg-type]
