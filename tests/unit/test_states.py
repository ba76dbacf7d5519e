from __future__ import annotations

import itertools

import pytest

from episodic.core.errors import InvalidTransition
from episodic.core.states import ItemState, RunState, check_item_transition, check_run_transition

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
        check_run_transition(current, target)
    else:
        with pytest.raises(InvalidTransition):
            check_run_transition(current, target)


def test_completed_items_are_only_sent_back_to_pending_by_a_recorded_loss() -> None:
    # completed -> pending is `media restore --buy-again` (the lost image recorded); a
    # completed item is never claimed, failed or cancelled as it is
    check_item_transition(ItemState.COMPLETED, ItemState.PENDING)
    for target in set(ItemState) - {ItemState.PENDING}:
        with pytest.raises(InvalidTransition):
            check_item_transition(ItemState.COMPLETED, target)
    check_item_transition(ItemState.FAILED, ItemState.RUNNING)  # retry
    with pytest.raises(InvalidTransition):
        check_item_transition(ItemState.PENDING, ItemState.COMPLETED)  # never without running
