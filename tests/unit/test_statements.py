"""Every transition label of `storage.statements` is a move `core.states` allows, and every
move of the item and submission tables is made by a labelled statement: the tables say what
the SQL does."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import TextClause, true
from sqlalchemy.dialects import sqlite

from episodic.core.errors import InvalidTransition
from episodic.core.states import (
    DELETABLE_SUBMISSION_STATES,
    INITIAL_STATES,
    TABLES,
    TRANSITIONS,
    EpisodeState,
    RunState,
    sources_of,
)
from episodic.storage import statements
from episodic.storage.dbapi import DriverSQL

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


# ---------------------------------------------------------------- the SQL under each label
NOW = datetime(2026, 8, 3, 10, 0, tzinfo=UTC)
# How each labelled function is built for the check: its own guard only (a caller's
# selection condition is passed as TRUE, so a source state the statement leaves to its
# caller is missing from its WHERE and the check fails). A function of a `*` label is built
# per target.
BUILT: dict[str, Callable[..., Any]] = {
    "move_run": lambda target: statements.move_run("r", RunState(target), {}),
    "abandon_pending_run": lambda: statements.abandon_pending_run("r", NOW, "why"),
    "cancel_orphaned": lambda: statements.cancel_orphaned(true(), NOW),
    "restart_cancelled": lambda: statements.restart_cancelled("r"),
    "give_up_items": lambda: statements.give_up_items(true(), "owner", "why", NOW),
    "mark_unknown": lambda: statements.mark_unknown(1, "why"),
    "refuse": lambda: statements.refuse(1, "why", NOW),
    "close_failed": lambda: statements.close_failed(1, "why", NOW),
    "withdraw_intent": lambda: statements.withdraw_intent(1),
    "withdraw_unreceived": lambda: statements.withdraw_unreceived(1, 1, NOW),
    "set_episode_state": lambda target: statements.set_episode_state(
        1, sources_of("episode", target), EpisodeState(target), NOW
    ),
    "fail_expired_runs": lambda: statements.fail_expired_runs(["r"], true(), NOW),
    "fail_expired_items": lambda: statements.fail_expired_items([1], true(), NOW),
    "cancel_stale_pending": lambda: statements.cancel_stale_pending(["r"], true(), NOW, 60),
}


def labelled_statements() -> list[tuple[str, str, list[str], str]]:
    """(name, machine, sources, target) of every label and the statement defined under it."""
    lines = SOURCE.read_text().splitlines()
    found = []
    for n, line in enumerate(lines):
        match = LABEL.match(line.strip())
        if match is None:
            continue
        machine, sources, target = match.groups()
        under = next(x for x in lines[n + 1 :] if x.strip() and not x.startswith("#"))
        name = re.match(r"(?:def )?(\w+)", under)
        assert name is not None, under
        bare = [re.sub(r"\(.*\)$", "", s.strip()) or s.strip() for s in sources.split(", ")]
        found.append((name.group(1), machine, bare, target.strip()))
    return found


def sql_of(name: str, *args: str) -> str:
    """The statement's SQL as SQLite receives it, literal values inlined."""
    made = getattr(statements, name)
    if isinstance(made, DriverSQL):
        return made.sqlite
    if isinstance(made, TextClause):
        return " ".join(made.text.split())
    built = BUILT[name](*args)
    return str(built.compile(dialect=sqlite.dialect(), compile_kwargs={"literal_binds": True}))


def guarded_states(sql: str, table: str) -> set[str]:
    """The states of `table`'s own state column its WHERE names (``state = 'x'``, ``state IN
    ('x', 'y')``, bare or as ``table.state``; another table's ``runs.state`` is not its)."""
    where = sql.split(" WHERE ", 1)[1] if " WHERE " in sql else ""
    own = re.compile(
        rf"(?<![\w.])(?:{table}\.)?state\s*(?:=\s*'(\w+)'|IN\s*\(([^)]*)\))", re.IGNORECASE
    )
    states: set[str] = set()
    for one, many in own.findall(where):
        states |= {one} if one else set(re.findall(r"'(\w+)'", many))
    return states


def set_state(sql: str, table: str) -> str | None:
    head = sql.split(" WHERE ", 1)[0]
    match = re.search(r"\bSET\b.*?(?<![\w.])state\s*=\s*'(\w+)'", head, re.IGNORECASE | re.S)
    return None if match is None else match.group(1)


def test_every_labelled_function_is_built_for_the_check() -> None:
    functions = {
        name
        for name, *_ in labelled_statements()
        if not isinstance(getattr(statements, name), DriverSQL | TextClause)
    }
    assert functions == set(BUILT)


@pytest.mark.parametrize(
    ("name", "machine", "sources", "target"),
    labelled_statements(),
    ids=[f"{n}" for n, *_ in labelled_statements()],
)
def test_the_sql_under_each_label_makes_exactly_its_move(
    name: str, machine: str, sources: list[str], target: str
) -> None:
    """Read from the SQL itself: an insert writes the machine's initial state, a delete and
    an update guard exactly the label's sources in their WHERE (a ``*`` label: the table's
    sources of each target), and an update sets the label's target."""
    table = TABLES[machine]
    if sources == ["(new)"]:
        sql = sql_of(name)
        assert sql.startswith(f"INSERT INTO {table} ") and f"'{target}'" in sql
        return
    if target == "(deleted)":
        sql = sql_of(name)
        assert sql.startswith(f"DELETE FROM {table} ")
        assert guarded_states(sql, table) == set(sources)
        return
    cases = (
        [(t, sources_of(machine, t), sql_of(name, t)) for t in TRANSITIONS[machine]]
        if sources == ["*"]
        else [(target, sources, sql_of(name))]
    )
    for moved_to, moved_from, sql in cases:
        if not moved_from:
            continue  # a state no move reaches (pending): nothing to guard
        assert sql.startswith(f"UPDATE {table} SET "), sql
        assert set_state(sql, table) == moved_to, sql
        assert guarded_states(sql, table) == set(moved_from), sql


def test_the_sql_check_sees_a_missing_guard() -> None:
    assert guarded_states("UPDATE items SET state = 'running' WHERE id = :b_item", "items") == set()
    assert guarded_states(
        "UPDATE items SET state = 'x' WHERE id = 1 AND EXISTS (SELECT 1 FROM runs WHERE "
        "runs.state = 'running') AND items.state IN ('pending', 'failed')",
        "items",
    ) == {"pending", "failed"}


def test_an_episode_move_from_a_source_the_table_forbids_is_refused() -> None:
    with pytest.raises(InvalidTransition, match="episode cannot go from allocated to approved"):
        statements.set_episode_state(1, ["allocated"], EpisodeState.APPROVED, NOW)


def test_the_take_and_the_intent_in_one_statement_are_the_two_labelled_ones() -> None:
    """PostgreSQL's one round trip for a claim batch's new paid calls makes exactly the moves
    of `TAKE_ITEM_AND_COUNT` and `INSERT_INTENT` for each asked item: the same update under
    the same guard, and an intent with the same columns, only for the items the update took."""
    one = statements.TAKE_AND_INTEND.sqlite
    take = statements.TAKE_ITEM_AND_COUNT.sqlite.removesuffix(" RETURNING attempts")
    per_item = take.replace(":b_token", "asked.token").replace(":b_item", "asked.item")
    head, sets = per_item.split(" WHERE ", 1)
    assert f"taken AS ({head} FROM asked WHERE {sets} RETURNING id, attempts," in one
    assert one.startswith("WITH asked AS (SELECT * FROM unnest(")
    columns = re.search(r"INSERT INTO submissions (\([^)]*\))", statements.INSERT_INTENT.sqlite)
    assert columns is not None and f"INSERT INTO submissions {columns.group(1)} SELECT" in one
    assert "'intent'" in one
    assert one.endswith("FROM taken RETURNING item_pk, id, attempt, client_reference")


def test_the_completion_in_one_statement_makes_the_three_moves_in_order() -> None:
    """PostgreSQL's one round trip for a completion makes exactly `COMPLETE_ITEM`'s and
    `SUCCEED`'s moves under their own guards, the submission only when the item moved, and the
    cost entry of `INSERT_COST`'s columns only when the submission moved."""
    one = statements.COMPLETE_AND_CHARGE.sqlite
    item, succeed = statements.COMPLETE_ITEM.sqlite, statements.SUCCEED.sqlite
    assert one.startswith(f"WITH done AS ({item} RETURNING id), ")
    assert f"paid AS ({succeed} AND EXISTS (SELECT 1 FROM done) RETURNING id) " in one
    columns = re.search(r"INSERT INTO cost_entries (\([^)]*\))", statements.INSERT_COST.sqlite)
    assert columns is not None
    assert f"INSERT INTO cost_entries {columns.group(1)} SELECT :b_episode, paid.id," in one
    assert one.endswith("FROM paid RETURNING id")
