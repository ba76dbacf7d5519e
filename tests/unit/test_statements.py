"""Every transition label of `storage.statements` is a move `core.states` allows, and every
move of the item and submission tables is made by a labelled statement: the tables say what
the SQL does."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from episodic.core.states import DELETABLE_SUBMISSION_STATES, INITIAL_STATES, TRANSITIONS

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


STORAGE = SOURCE.parent
# A state move written as SQL text, or as SQLAlchemy Core: UPDATE of a state machine's table
# that sets its state column.
_TEXT_MOVE = re.compile(
    r"UPDATE\s+(items|submissions|runs|episodes)\s+SET[^\"']*?\bstate\s*=", re.I
)
_CORE_MOVE = re.compile(
    r"update\(\s*(_items|_subs|_submissions|_runs|_episodes|ItemRow|SubmissionRow|RunRow|"
    r"EpisodeRow)\b(?:(?!\bupdate\().){0,400}?\.values\((?:[^()]|\([^()]*\))*?\bstate\s*=",
    re.S,
)


def state_moves_outside(source: str) -> list[str]:
    """The state-moving statements in one module's `source` (what only statements.py may hold)."""
    return [m.group(0)[:60] for m in (*_TEXT_MOVE.finditer(source), *_CORE_MOVE.finditer(source))]


def test_only_the_statements_module_moves_states() -> None:
    """Every statement that moves a run, item, submission or episode state is labelled in
    storage/statements.py: no other storage module writes one (inserts of new rows at their
    initial state stay with their stores)."""
    found = {
        str(path.relative_to(STORAGE)): moves
        for path in STORAGE.rglob("*.py")
        if path.name not in ("statements.py", "models.py") and "migrations" not in path.parts
        if (moves := state_moves_outside(path.read_text()))
    }
    assert found == {}


def test_a_state_move_outside_the_statements_module_is_seen() -> None:
    assert state_moves_outside("text(\"UPDATE submissions SET state = 'failed' WHERE id = 1\")")
    assert state_moves_outside("update(_items).where(_items.c.id == 1).values(state='done')")
    assert not state_moves_outside("update(_items).values(lease_expires_at=None)")
    assert not state_moves_outside('text("UPDATE runs SET heartbeat_at = :now")')
