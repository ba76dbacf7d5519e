"""Write transactions: on SQLite they take the write lock up front (``BEGIN IMMEDIATE``).

A deferred SQLite transaction that reads and then writes can fail at once with "database is
locked" when another writer got there first; an immediate one waits its turn (busy timeout).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine, Table, text

from storage.engine import writer_lock


@contextmanager
def write(engine: Engine, lock: str | None = None) -> Iterator[Connection]:
    """A write transaction; with `lock`, also serialized with every other transaction that
    names it (Postgres: an advisory transaction lock taken first; SQLite: its write lock
    already serializes every writer)."""
    with (
        writer_lock(engine),
        engine.connect().execution_options(sqlite_begin="IMMEDIATE") as conn,
        conn.begin(),
    ):
        if lock is not None and conn.dialect.name == "postgresql":
            from storage.lock import advisory_key

            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": advisory_key(lock)})
        yield conn


@contextmanager
def read(engine: Engine) -> Iterator[Connection]:
    with engine.connect() as conn, conn.begin():
        yield conn


def insert_for(conn: Connection, table: Table) -> Any:
    """The dialect's INSERT, which has ``on_conflict_do_nothing`` / ``on_conflict_do_update``
    on both backends (Postgres and SQLite share the syntax)."""
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(table)
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return sqlite_insert(table)
