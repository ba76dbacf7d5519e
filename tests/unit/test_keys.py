from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from episodic.core.errors import InvalidInput, NoInvocationIdentity
from episodic.core.keys import (
    Invocation,
    SlotKey,
    derive_allocation_key,
    parse_slot,
    slot_key,
    utc_iso,
    validate_key,
)

SLOT = datetime(2026, 8, 3, 0, 30, tzinfo=timezone(timedelta(hours=2)))


def scheduled(**overrides: object) -> Invocation:
    fields: dict[str, object] = {
        "flow_name": "weekly-episode",
        "flow_run_id": "run-1",
        "deployment_name": "weekly",
        "auto_scheduled": True,
        "expected_start_time": SLOT,
    }
    fields.update(overrides)
    return Invocation(**fields)  # type: ignore[arg-type]


def key(invocation: Invocation | None, explicit: str | None = None) -> str:
    return derive_allocation_key(invocation, explicit, pipeline="weekly")


def test_scheduled_run_key_is_the_pipeline_and_its_slot_in_utc() -> None:
    assert key(scheduled()) == "slot:weekly:2026-08-02T22:30:00Z"


def test_a_retry_or_recreated_run_for_the_same_slot_gets_the_same_key() -> None:
    first = key(scheduled(flow_run_id="run-1"))
    recreated = key(scheduled(flow_run_id="run-2"))
    assert first == recreated


def test_two_deployments_scheduling_one_pipeline_at_one_moment_get_one_key() -> None:
    """A copy of the weekly deployment (or a renamed one left behind) with the same cron on
    the same pipeline asks for the same episode, and never pays again."""
    copy = scheduled(deployment_name="weekly-copy", flow_run_id="run-2")
    assert key(scheduled()) == key(copy)
    assert derive_allocation_key(copy, pipeline="other") != key(copy)  # the slot is P's


def test_a_slot_key_names_its_pipeline_and_moment_and_an_old_key_its_deployment() -> None:
    assert SlotKey.parse("slot:weekly:2026-08-02T22:30:00Z") == SlotKey(
        "2026-08-02T22:30:00Z", pipeline="weekly"
    )
    old = SlotKey.parse("scheduled:weekly-episode/weekly-copy:2026-08-02T22:30:00Z")
    assert old == SlotKey("2026-08-02T22:30:00Z", deployment="weekly-episode/weekly-copy")
    assert old.moment == datetime(2026, 8, 2, 22, 30, tzinfo=UTC)
    for other in ("flow-run:1", "scheduled:slot-1", "replay:2026-08-02T22:30:00Z", "slot:x"):
        assert SlotKey.parse(other) is None


def test_the_old_key_pattern_matches_only_the_same_moment() -> None:
    import fnmatch

    pattern = SlotKey("2026-08-02T22:30:00Z").legacy_pattern.replace("%", "*")
    assert fnmatch.fnmatchcase("scheduled:weekly-episode/weekly:2026-08-02T22:30:00Z", pattern)
    assert not fnmatch.fnmatchcase("scheduled:weekly-episode/w:2026-08-02T22:30:01Z", pattern)


def test_slot_key_is_canonical_utc_whatever_the_offset_given() -> None:
    berlin = parse_slot("2026-08-06T09:00:00+02:00")
    assert slot_key("weekly", berlin) == slot_key("weekly", parse_slot("2026-08-06T07:00:00Z"))
    assert slot_key("weekly", berlin) == "slot:weekly:2026-08-06T07:00:00Z"


@pytest.mark.parametrize(
    "bad",
    [
        "2026-08-06T09:00:00",
        "2026-08-06",
        "next monday",
        "",
        "2026-08-06T07:00:00.5Z",  # no schedule makes a sub-second slot
        "0001-01-01T00:00:00+14:00",  # before year 1 in UTC (an OverflowError before)
        "9999-12-31T23:59:59+00:00",  # its ISO week's end is past datetime's range
    ],
)
def test_a_slot_needs_a_moment_with_its_offset(bad: str) -> None:
    with pytest.raises(InvalidInput):
        parse_slot(bad)


@pytest.mark.parametrize(
    "near_miss",
    [
        "slot:weekly:2026-08-06T09:00:00+02:00",
        "slot:Weekly:2026-08-06T07:00:00Z",
        "slot:w",
        # the same moment spelled otherwise would be a second episode
        "slot:weekly:2026-08-06T07:00:00.000000Z",
        "slot:weekly:2026-08-06T07:00:00.000001Z",
    ],
)
def test_an_explicit_key_that_looks_like_a_slot_but_is_not_canonical_is_refused(
    near_miss: str,
) -> None:
    """It would own a second episode for the slot its canonical key already owns."""
    with pytest.raises(InvalidInput, match="not a slot key"):
        validate_key(near_miss)


def test_manual_run_key_is_the_flow_run_id() -> None:
    manual = scheduled(auto_scheduled=False)
    assert key(manual) == "flow-run:run-1"
    assert key(scheduled(deployment_name=None)) == "flow-run:run-1"


def test_explicit_key_wins_even_inside_a_flow_run() -> None:
    assert key(scheduled(), "replay:42") == "replay:42"
    assert key(None, "cli:1") == "cli:1"


def test_outside_a_flow_run_there_is_no_key() -> None:
    with pytest.raises(NoInvocationIdentity):
        key(None)


@pytest.mark.parametrize("bad", ["", "   ", " padded", "tab\there", "x" * 513])
def test_explicit_keys_are_validated(bad: str) -> None:
    with pytest.raises(InvalidInput):
        key(None, bad)


def test_utc_iso_keeps_microseconds_and_refuses_naive() -> None:
    assert utc_iso(datetime(2026, 1, 1, 0, 0, 0, 5, tzinfo=UTC)) == "2026-01-01T00:00:00.000005Z"
    with pytest.raises(InvalidInput):
        utc_iso(datetime(2026, 1, 1))


def test_a_slot_key_is_one_spelling_of_a_whole_second() -> None:
    with pytest.raises(InvalidInput, match="whole second"):
        slot_key("weekly", datetime(2026, 8, 6, 7, 0, 0, 500, tzinfo=UTC))
