from __future__ import annotations

import itertools

import pytest

from episodic.core.errors import InvalidTransition
from episodic.core.states import (
    STATES,
    TRANSITIONS,
    ItemState,
    RunState,
    check_transition,
    state_check_sql,
)

ALLOWED_RUN = {
    ("pending", "running"),
    ("pending", "cancelled"),
    ("running", "completed"),
    ("running", "failed"),
    ("running", "cancelled"),
    ("running", "paused"),
    ("paused", "running"),
    ("paused", "cancelled"),
    ("failed", "running"),
}


@pytest.mark.parametrize(("current", "target"), list(itertools.product(RunState, RunState)))
def test_run_transitions_are_exactly_the_designed_ones(current: RunState, target: RunState) -> None:
    if (current.value, target.value) in ALLOWED_RUN:
        check_transition("run", current, target)
    else:
        with pytest.raises(InvalidTransition):
            check_transition("run", current, target)


def test_completed_items_are_only_sent_back_to_pending_by_a_recorded_loss() -> None:
    # completed -> pending is `media restore --buy-again` (the lost image recorded); a
    # completed item is never claimed, failed or cancelled as it is
    check_transition("item", ItemState.COMPLETED, ItemState.PENDING)
    for target in set(ItemState) - {ItemState.PENDING}:
        with pytest.raises(InvalidTransition):
            check_transition("item", ItemState.COMPLETED, target)
    check_transition("item", ItemState.FAILED, ItemState.RUNNING)  # retry
    with pytest.raises(InvalidTransition):
        check_transition("item", ItemState.PENDING, ItemState.COMPLETED)  # never without running


def test_a_state_no_machine_has_is_no_transition() -> None:
    with pytest.raises(InvalidTransition, match="item cannot go from bogus to running"):
        check_transition("item", "bogus", "running")
    with pytest.raises(InvalidTransition):
        check_transition("episode", "allocated", "bogus")


@pytest.mark.parametrize("machine", sorted(STATES))
def test_every_state_has_a_row_in_its_table_and_in_its_check(machine: str) -> None:
    states = [s.value for s in STATES[machine]]
    assert set(TRANSITIONS[machine]) == set(states)
    assert all(set(targets) <= set(states) for targets in TRANSITIONS[machine].values())
    assert state_check_sql(machine) == "state IN (" + ", ".join(f"'{s}'" for s in states) + ")"
