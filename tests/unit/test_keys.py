from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from core.errors import InvalidInput, NoInvocationIdentity
from core.keys import Invocation, derive_allocation_key, utc_iso

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


def test_scheduled_run_key_is_deployment_and_slot_in_utc() -> None:
    assert derive_allocation_key(scheduled()) == (
        "scheduled:weekly-episode/weekly:2026-08-02T22:30:00Z"
    )


def test_a_retry_or_recreated_run_for_the_same_slot_gets_the_same_key() -> None:
    first = derive_allocation_key(scheduled(flow_run_id="run-1"))
    recreated = derive_allocation_key(scheduled(flow_run_id="run-2"))
    assert first == recreated


def test_manual_run_key_is_the_flow_run_id() -> None:
    manual = scheduled(auto_scheduled=False)
    assert derive_allocation_key(manual) == "flow-run:run-1"
    assert derive_allocation_key(scheduled(deployment_name=None)) == "flow-run:run-1"


def test_explicit_key_wins_even_inside_a_flow_run() -> None:
    assert derive_allocation_key(scheduled(), "replay:42") == "replay:42"
    assert derive_allocation_key(None, "cli:1") == "cli:1"


def test_outside_a_flow_run_there_is_no_key() -> None:
    with pytest.raises(NoInvocationIdentity):
        derive_allocation_key(None)


@pytest.mark.parametrize("bad", ["", "   ", " padded", "tab\there", "x" * 513])
def test_explicit_keys_are_validated(bad: str) -> None:
    with pytest.raises(InvalidInput):
        derive_allocation_key(None, bad)


def test_utc_iso_keeps_microseconds_and_refuses_naive() -> None:
    assert utc_iso(datetime(2026, 1, 1, 0, 0, 0, 5, tzinfo=UTC)) == "2026-01-01T00:00:00.000005Z"
    with pytest.raises(InvalidInput):
        utc_iso(datetime(2026, 1, 1))
