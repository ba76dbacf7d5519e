"""Write transactions: on SQLite they take the write lock up front (``BEGIN IMMEDIATE``).

A deferred SQLite transaction that reads and then writes can fail at once with "database is
locked" when another writer got there first; an immediate one waits its turn (busy timeout).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Connection, Engine


@contextmanager
def write(engine: Engine) -> Iterator[Connection]:
    with engine.connect().execution_options(sqlite_begin="IMMEDIATE") as conn, conn.begin():
        yield conn


@contextmanager
def read(engine: Engine) -> Iterator[Connection]:
    with engine.connect() as conn, conn.begin():
        yield conn
