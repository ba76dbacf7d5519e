"""Transactions, and riding out a database outage.

Write transactions on SQLite take the write lock up front (``BEGIN IMMEDIATE``): a deferred
SQLite transaction that reads and then writes can fail at once with "database is locked" when
another writer got there first; an immediate one waits its turn (busy timeout).

A PostgreSQL server that restarts, fails over or drops connections (``pg_terminate_backend``)
breaks the calls in flight. `retry_outages` makes a store's methods retry such a call, for up
to `OUTAGE_S` seconds, only when retrying is provably safe: the error is a lost connection (or
a connection that could not be made) and nothing the call wrote was committed, or could have
been (a commit whose reply was lost is not retried: its outcome is unknown, so the caller sees
the error), or the method is marked `idempotent` (running it twice is running it once).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar

from filelock import Timeout as FileLockTimeout
from sqlalchemy import Connection, Engine, Table
from sqlalchemy.exc import DBAPIError, OperationalError
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential_jitter

from episodic.storage import dbapi
from episodic.storage.engine import writer_lock

OUTAGE_S = 30.0
"""How long a store call waits for the database to come back (seconds)."""


@dataclass
class _Call:
    wrote: bool = False  # a write of this call committed, or may have


_CALLS: ContextVar[tuple[_Call, ...]] = ContextVar("episodic_store_calls", default=())


@contextmanager
def tracked_commit() -> Iterator[list[bool]]:
    """Wraps a write transaction: every store call in progress learns that it wrote, when the
    commit succeeds or fails after the body finished (the reply of a COMMIT may be lost)."""
    body_done = [False]
    try:
        yield body_done
    except BaseException:
        if body_done[0]:
            for call in _CALLS.get():
                call.wrote = True
        raise
    for call in _CALLS.get():
        call.wrote = True


def is_lost_connection(exc: BaseException) -> bool:
    """A PostgreSQL connection lost (SQLAlchemy invalidated it) or not made at all (a connect
    error has no statement). SQLite has no connections to lose: its errors never qualify."""
    if not isinstance(exc, DBAPIError) or type(exc.orig).__module__.split(".")[0] != "psycopg":
        return False
    return bool(exc.connection_invalidated) or exc.statement is None


def is_transient(exc: BaseException) -> bool:
    """Database trouble that a later try of the same whole operation may not meet: a lock
    wait that timed out (SQLite's busy timeout, the file lock of a SQLite writer), any
    operational error of the driver, or a connection SQLAlchemy invalidated. For callers
    that retry an operation that is safe to repeat as a whole (an allocation decides in one
    transaction); a store's own outage retry is narrower (`retry_outage`)."""
    if isinstance(exc, FileLockTimeout | OperationalError):
        return True
    return isinstance(exc, DBAPIError) and exc.connection_invalidated


def database_cause(exc: BaseException) -> BaseException | None:
    """The driver's error a database error wraps (its own message, without SQLAlchemy's
    statement and background link), or None when `exc` is not a database error."""
    return exc.orig if isinstance(exc, DBAPIError) else None


_Fn = TypeVar("_Fn", bound=Callable[..., Any])


def _attempt(calls: list[_Call], fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    calls.append(_Call())
    token = _CALLS.set((*_CALLS.get(), calls[-1]))
    try:
        return fn(*args, **kwargs)
    finally:
        _CALLS.reset(token)


def idempotent(fn: _Fn) -> _Fn:
    """Marks a store method whose second run changes nothing the first one committed (a
    guarded move, a heartbeat): `retry_outages` retries it even after a COMMIT whose reply
    was lost."""
    fn.__episodic_idempotent__ = True  # type: ignore[attr-defined]
    return fn


def retry_outage(fn: _Fn) -> _Fn:
    """Function decorator: the call is retried when it lost its database connection before
    anything it wrote was committed, or could have been (see the module's docstring)."""
    repeatable = getattr(fn, "__episodic_idempotent__", False)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls: list[_Call] = []
        try:  # the common case costs a context variable, not a tenacity loop
            return _attempt(calls, fn, args, kwargs)
        except DBAPIError as exc:
            if not is_lost_connection(exc) or (calls[-1].wrote and not repeatable):
                raise

        def safe(exc: BaseException) -> bool:
            return is_lost_connection(exc) and (repeatable or not calls[-1].wrote)

        for attempt in Retrying(
            retry=retry_if_exception(safe),
            stop=stop_after_delay(OUTAGE_S),
            wait=wait_exponential_jitter(multiplier=0.1, max=2.0, jitter=0.2),
            reraise=True,
        ):
            with attempt:
                return _attempt(calls, fn, args, kwargs)
        raise AssertionError("unreachable")  # pragma: no cover

    return wrapper  # type: ignore[return-value]


_Cls = TypeVar("_Cls", bound=type)


def retry_outages(cls: _Cls) -> _Cls:
    """Class decorator: every public method of a store retries a call that lost its database
    connection before anything it wrote was committed (see the module's docstring)."""
    for name, member in list(vars(cls).items()):
        if name.startswith("_") or not inspect.isfunction(member):
            continue
        if inspect.isgeneratorfunction(member):
            continue
        setattr(cls, name, retry_outage(member))
    return cls


_ADVISORY_XACT_LOCK = dbapi.DriverSQL("SELECT pg_advisory_xact_lock(:b_key)")
# Several locks in one round trip: a function scan yields the array's elements in its order,
# and each row's lock is taken before the next row is produced, so the keys are locked in
# the order given (ascending, by the caller) as one statement per key would take them.
_ADVISORY_XACT_LOCKS = dbapi.DriverSQL(
    "SELECT count(pg_advisory_xact_lock(k)) FROM unnest(CAST(:b_keys AS bigint[])) AS k"
)


def advisory_key(name: str) -> int:
    """A signed 64-bit integer derived from ``name`` (the range of a Postgres bigint)."""
    digest = hashlib.sha256(f"episodic:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


_lock_key = functools.lru_cache(maxsize=1024)(advisory_key)


def advisory_xact_lock(conn: Connection, name: str) -> None:
    """PostgreSQL: take the transaction lock named `name` (held until commit or rollback;
    the wait is bounded by the connection's lock_timeout). On the bare driver
    (`episodic.storage.dbapi`): through SQLAlchemy Core this statement cost a third of a claim's
    transaction (bench/batch.py)."""
    dbapi.fetch_one(conn, _ADVISORY_XACT_LOCK, {"b_key": _lock_key(name)})


def advisory_xact_locks(conn: Connection, names: Sequence[str]) -> None:
    """PostgreSQL: take every lock of `names` (duplicates once), in ascending key order (the
    one global order, `episodic.storage.locks`), in one statement."""
    keys = sorted({_lock_key(name) for name in names})
    if len(keys) == 1:
        dbapi.fetch_one(conn, _ADVISORY_XACT_LOCK, {"b_key": keys[0]})
    elif keys:
        dbapi.fetch_one(conn, _ADVISORY_XACT_LOCKS, {"b_keys": keys})


@contextmanager
def write(engine: Engine, lock: str | Sequence[str] | None = None) -> Iterator[Connection]:
    """A write transaction; with `lock` (a name, or several), also serialized with every
    other transaction that names it (Postgres: advisory transaction locks taken first, several
    in ascending key order, the one global order of `episodic.storage.locks`, so two transactions
    naming overlapping sets never wait for each other in a cycle; SQLite: its write lock
    already serializes every writer)."""
    with (
        tracked_commit() as body_done,
        writer_lock(engine),
        engine.connect().execution_options(sqlite_begin="IMMEDIATE") as conn,
        conn.begin(),
    ):
        if lock is not None and conn.dialect.name == "postgresql":
            advisory_xact_locks(conn, [lock] if isinstance(lock, str) else lock)
        yield conn
        body_done[0] = True


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
