"""Hand-written statements of the paid path, run on the DBAPI cursor inside SQLAlchemy's
transactions.

Every paid item runs three short write transactions by design: the claim with the intent,
the acceptance, the outcome with its cost. Through SQLAlchemy Core each of their statements
costs 15-100 µs of interpreter time (cache key, parameter and result processing), about ten
times the driver's own; with 8 or 32 items at once on two cores that time, held under the
interpreter lock and SQLite's writer lock, was what limited a run (`bench/ledger.py`,
docs/performance.md). Here those statements are hand-written SQL executed on the DBAPI
cursor of the SQLAlchemy connection that `episodic.storage.tx` opened:

- SQLAlchemy still owns the pool, the transaction (``BEGIN IMMEDIATE`` on SQLite, COMMIT),
  and `episodic.storage.tx` its outage retries and commit tracking; only statement execution is
  replaced;
- a driver error is raised as SQLAlchemy's `DBAPIError` subclass for it (`IntegrityError`,
  `OperationalError`, ...), with the connection invalidated when the dialect says it was
  lost, as `Connection.execute` does: callers and `tx.is_lost_connection` see one kind of error;
- parameters and results are converted as the schema's types do: datetimes are aware UTC in
  Python, naive UTC text on SQLite (SQLAlchemy's storage format, so comparisons in SQL
  order the same), ``timestamptz`` on PostgreSQL.

Statements are written with ``:name`` parameters and literal state names; `DriverSQL` derives the
psycopg form (``%(name)s``) once.

The module is named for what it does (statements on the DBAPI cursor), not for how fast it is.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple

from sqlalchemy import Connection, Dialect
from sqlalchemy.exc import DBAPIError

from episodic.storage.base import UTCDateTime

_SQLITE_FORMAT = "%Y-%m-%d %H:%M:%S.%f"  # SQLAlchemy's SQLite DATETIME storage format
_PARAM = re.compile(r"(?<![:\w]):([a-z_][a-z0-9_]*)")


class DriverSQL:
    """One hand-written statement in both drivers' parameter styles."""

    __slots__ = ("pg", "sqlite")

    def __init__(self, sql: str, *, pg_suffix: str = "") -> None:
        """`sql` with ``:name`` parameters; `pg_suffix` is appended on PostgreSQL only (such
        as ``FOR UPDATE``, which SQLite has no use for: its writer lock is held already)."""
        self.sqlite = " ".join(sql.split())
        pg = f"{self.sqlite} {pg_suffix}".strip()
        self.pg = _PARAM.sub(r"%(\1)s", pg.replace("%", "%%"))


_UTC = UTCDateTime()


def states_sql(states: list[str]) -> str:
    """``(state = 'a' OR state = 'b')``: plain equalities, literal names from our own enums."""
    return "(" + " OR ".join(f"state = '{state}'" for state in states) + ")"


def _bind(value: Any, dialect: Dialect) -> Any:
    """A parameter as the schema's type would bind it (a datetime: aware, to UTC; naive
    refused), in the text format SQLAlchemy stores on SQLite."""
    if not isinstance(value, datetime):
        return value
    bound = _UTC.process_bind_param(value, dialect)
    assert bound is not None
    return bound.strftime(_SQLITE_FORMAT) if dialect.name == "sqlite" else bound


def moment(value: Any) -> datetime | None:
    """A datetime column of a row read here, as an aware UTC datetime (None stays None)."""
    if value is None:
        return None
    if isinstance(value, str):  # SQLite
        return datetime.fromisoformat(value).replace(tzinfo=UTC)
    parsed: datetime = value
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


class _Run:
    """A statement's execution and fetch, with driver errors raised as SQLAlchemy's."""

    __slots__ = ("args", "conn", "cursor", "sql")

    def __init__(self, conn: Connection, statement: DriverSQL, params: Mapping[str, Any]) -> None:
        self.conn = conn
        self.sql = statement.sqlite if conn.dialect.name == "sqlite" else statement.pg
        self.args = {name: _bind(value, conn.dialect) for name, value in params.items()}
        driver = conn.connection.driver_connection
        assert driver is not None  # an open connection of a live transaction
        self.cursor = driver.cursor()

    def __enter__(self) -> Any:
        return self.cursor

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        self.cursor.close()
        dbapi = self.conn.dialect.loaded_dbapi
        if exc is None or not isinstance(exc, dbapi.Error):
            return
        lost = self.conn.dialect.is_disconnect(
            exc, self.conn.connection.dbapi_connection, self.cursor
        )
        if lost and not self.conn.invalidated:
            # As `Connection.execute` does: every connection pooled before this one is
            # stale too (a server restart, a terminate storm), so the pool replaces them at
            # their next checkout instead of each failing in turn.
            self.conn.engine.pool._invalidate(self.conn.connection, exc)
            self.conn.invalidate(exc)
        raise DBAPIError.instance(
            self.sql,
            self.args,
            exc,
            dbapi.Error,
            connection_invalidated=lost,
            dialect=self.conn.dialect,
        ) from exc


def fetch_one(
    conn: Connection, statement: DriverSQL, params: Mapping[str, Any]
) -> Sequence[Any] | None:
    """The first row (a tuple in the statement's column order), or None.

    Raises SQLAlchemy's `DBAPIError` subclass for a driver error (see the module's docstring).
    """
    run = _Run(conn, statement, params)
    with run as cursor:
        cursor.execute(run.sql, run.args)
        row: Sequence[Any] | None = cursor.fetchone()
        return row


def fetch_all(
    conn: Connection, statement: DriverSQL, params: Mapping[str, Any]
) -> list[Sequence[Any]]:
    """Every row (tuples in the statement's column order); raises as `fetch_one`."""
    run = _Run(conn, statement, params)
    with run as cursor:
        cursor.execute(run.sql, run.args)
        return list(cursor.fetchall())


def scalar(conn: Connection, statement: DriverSQL, params: Mapping[str, Any]) -> Any:
    """The first column of the first row, or None without a row."""
    row = fetch_one(conn, statement, params)
    return None if row is None else row[0]


def rowcount(conn: Connection, statement: DriverSQL, params: Mapping[str, Any]) -> int:
    """Rows a write statement changed (raises as `fetch_one`)."""
    run = _Run(conn, statement, params)
    with run as cursor:
        cursor.execute(run.sql, run.args)
        return int(cursor.rowcount)


class Part(NamedTuple):
    """One read of `fetch_parts`: a SELECT answering exactly one row of `columns` columns,
    with ``:name`` parameters of its own."""

    sql: str
    params: Mapping[str, Any]
    columns: int


_JOINED: dict[tuple[str, ...], DriverSQL] = {}


def _renamed(sql: str, n: int) -> str:
    """`sql` with each ``:name`` parameter renamed ``:p{n}_name``."""
    return _PARAM.sub(lambda m: f":p{n}_{m.group(1)}", sql)


def fetch_parts(conn: Connection, parts: Sequence[Part]) -> list[tuple[Any, ...]]:
    """Several one-row reads in one statement (one round trip): each part's row, in order.
    Each part's parameters are renamed for it, so two parts may give one name two values.
    The parts see one snapshot, as the statements of a REPEATABLE READ transaction would.

    Raises as `fetch_one`; an empty `parts` reads nothing."""
    if not parts:
        return []
    key = tuple(part.sql for part in parts)
    statement = _JOINED.get(key)
    if statement is None:
        joined = ", ".join(f"({_renamed(part.sql, n)}) AS p{n}" for n, part in enumerate(parts))
        statement = _JOINED.setdefault(key, DriverSQL(f"SELECT * FROM {joined}"))
    params = {f"p{n}_{k}": v for n, part in enumerate(parts) for k, v in part.params.items()}
    row = fetch_one(conn, statement, params)
    assert row is not None, "every part answers one row"
    out, at = [], 0
    for part in parts:
        out.append(tuple(row[at : at + part.columns]))
        at += part.columns
    assert at == len(row), "the parts' columns are the statement's"
    return out
