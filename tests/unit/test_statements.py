"""Every transition label of `storage.statements` is a move `core.states` allows, and every
move of the item and submission tables is made by a labelled statement: the tables say what
the SQL does."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from core.states import DELETABLE_SUBMISSION_STATES, INITIAL_STATES, TRANSITIONS

SOURCE = Path(__file__).resolve().parents[2] / "storage" / "statements.py"
LABEL = re.compile(r"^# (run|item|submission|episode): (.+) -> (.+)$")


def labels() -> list[tuple[str, list[str], str]]:
    """(machine, sources, target) of every label, qualifiers such as ``(expired)`` dropped."""
    found = []
    for line in SOURCE.read_text().splitlines():
        match = LABEL.match(line.strip())
        if match is None:
            continue
        machine, sources, target = match.groups()
        bare = [re.sub(r"\(.*\)$", "", s.strip()) or s.strip() for s in sources.split(", ")]
        found.append((machine, bare, target.strip()))
    return found


def moves() -> set[tuple[str, str, str]]:
    """(machine, source, target) of every labelled move (``*`` expanded from the table)."""
    made = set()
    for machine, sources, target in labels():
        table = TRANSITIONS[machine]
        for source in sources:
            if source == "*":
                made |= {(machine, s, t) for s, ts in table.items() for t in ts}
            else:
                made.add((machine, source, target))
    return made


def test_the_statements_are_labelled() -> None:
    assert len(labels()) >= 20
    assert {machine for machine, _, _ in labels()} == {"run", "item", "submission", "episode"}


@pytest.mark.parametrize(("machine", "sources", "target"), labels())
def test_every_label_is_a_transition_the_states_allow(
    machine: str, sources: list[str], target: str
) -> None:
    table = TRANSITIONS[machine]
    for source in sources:
        if source == "*":
            assert target == "*", "a statement that takes its sources from the table"
        elif source == "(new)":
            assert target == INITIAL_STATES[machine], f"a new {machine} starts {target}"
        elif target == "(deleted)":
            assert machine == "submission" and source in DELETABLE_SUBMISSION_STATES
        else:
            assert target in table[source], f"{machine}: {source} -> {target} is not allowed"


@pytest.mark.parametrize("machine", ["item", "submission"])
def test_every_allowed_move_is_made_by_a_statement(machine: str) -> None:
    table = TRANSITIONS[machine]
    allowed = {(machine, s, t) for s, ts in table.items() for t in ts}
    assert allowed <= moves(), sorted(allowed - moves())
