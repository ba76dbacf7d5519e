"""state machines in the schema: every state column keeps to its machine, one open call per item

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-07

- ``ck_<table>_state_known`` on ``runs``, ``items``, ``submissions`` and ``episodes``: the
  ``state`` column accepts exactly its machine's states (`episodic.core.states`, as they are
  at this revision: a state added later comes with a migration of its own, and
  tests/integration/test_schema_machines.py says so when one is missing).
- ``uq_submissions_one_open_per_item``: a partial unique index, at most one submission per
  item in an open state (intent, accepted, unknown), the ledger's "one paid call in flight
  per item" (`episodic.storage.models` says why it holds in every path).

The rows are checked first: a database holding a state outside its machine, or an item with
two open submissions, is refused with the offending rows named, before anything changes (a
constraint added over such rows would fail halfway on SQLite's table copies). SQLite
recreates the four tables to add their checks (`episodic.storage.schema.upgrade` turns its
foreign keys off around the transaction and checks them before the commit); PostgreSQL adds
them in place. Downgrade drops what this adds.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from episodic.core.errors import MigrationRefused

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

# The machines' states at this revision, table by table.
STATES = {
    "episodes": ("allocated", "generated", "approved", "rejected", "assembled"),
    "runs": ("pending", "running", "completed", "failed", "cancelled", "paused"),
    "items": ("pending", "running", "completed", "failed", "cancelled"),
    "submissions": ("intent", "accepted", "succeeded", "failed", "unknown"),
}
OPEN = ("intent", "accepted", "unknown")
SHOWN = 10  # offending rows named per kind; the rest are counted


def _in(states: tuple[str, ...]) -> str:
    return "state IN (" + ", ".join(f"'{s}'" for s in states) + ")"


# How an offending row is named to the person who mends it: its id, and what a reader knows
# it by (the episode and video of an item, the client reference of a paid call).
NAMED = {
    "episodes": "SELECT id, state, pipeline || ' ' || episode_id FROM episodes",
    "runs": "SELECT r.id, r.state, e.episode_id FROM runs r JOIN episodes e ON e.id = r.episode_pk",
    "items": (
        "SELECT i.id, i.state, e.episode_id || ' ' || i.video_id FROM items i "
        "JOIN episodes e ON e.id = i.episode_pk"
    ),
    "submissions": "SELECT id, state, client_reference FROM submissions",
}


def offending_rows(conn: sa.Connection) -> list[str]:
    """What the new constraints would refuse, one phrase per kind: rows whose state is
    outside their machine, and items with more than one open submission."""
    found: list[str] = []
    for table, states in STATES.items():
        alias = "" if table in ("episodes", "submissions") else table[0] + "."
        rows = conn.execute(
            sa.text(f"{NAMED[table]} WHERE NOT ({alias}{_in(states)}) ORDER BY 1")
        ).all()
        if rows:
            named = ", ".join(f"id {r[0]!s} ({r[2]}: {r[1]!r})" for r in rows[:SHOWN])
            more = f" and {len(rows) - SHOWN} more" if len(rows) > SHOWN else ""
            found.append(f"{len(rows)} {table} in no state of their machine: {named}{more}")
    doubled = conn.execute(
        sa.text(
            "SELECT s.item_pk, COUNT(*), MIN(e.episode_id || ' ' || i.video_id) FROM submissions s "
            "JOIN items i ON i.id = s.item_pk JOIN episodes e ON e.id = i.episode_pk "
            f"WHERE s.{_in(OPEN)} GROUP BY s.item_pk HAVING COUNT(*) > 1 ORDER BY s.item_pk"
        )
    ).all()
    if doubled:
        named = ", ".join(f"item {r[0]} ({r[2]}: {r[1]} open)" for r in doubled[:SHOWN])
        more = f" and {len(doubled) - SHOWN} more" if len(doubled) > SHOWN else ""
        found.append(f"{len(doubled)} items with more than one open submission: {named}{more}")
    return found


def upgrade() -> None:
    conn = op.get_bind()
    found = offending_rows(conn)
    if found:
        raise MigrationRefused(
            "schema upgrade to 0018 refused, nothing changed: "
            + "; ".join(found)
            + ". Mend them in the database with the version that wrote them (give each row "
            "a state of its machine; close all but one open submission of an item as failed: "
            'docs/architecture.md, "The state tables"), then upgrade again'
        )
    for table, states in STATES.items():
        name = op.f(f"ck_{table}_state_known")
        if conn.dialect.name == "sqlite":
            with op.batch_alter_table(table, recreate="always") as batch:
                batch.create_check_constraint(name, _in(states))
        else:
            op.create_check_constraint(name, table, _in(states))
    op.create_index(
        "uq_submissions_one_open_per_item",
        "submissions",
        ["item_pk"],
        unique=True,
        sqlite_where=sa.text(_in(OPEN)),
        postgresql_where=sa.text(_in(OPEN)),
    )


def downgrade() -> None:
    conn = op.get_bind()
    op.drop_index("uq_submissions_one_open_per_item", table_name="submissions")
    for table in STATES:
        name = op.f(f"ck_{table}_state_known")
        if conn.dialect.name == "sqlite":
            with op.batch_alter_table(table, recreate="always") as batch:
                batch.drop_constraint(name, type_="check")
        else:
            op.drop_constraint(name, table, type_="check")
