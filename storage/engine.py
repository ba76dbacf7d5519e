"""Engine setup for the two supported backends.

SQLite (the embedded default) runs in WAL mode with a busy timeout; pysqlite's own transaction
handling is switched off so that we emit ``BEGIN`` ourselves, and a connection can ask for
``BEGIN IMMEDIATE`` (take the write lock up front) with the ``sqlite_begin`` execution option.
"""

from __future__ import annotations

import threading
import weakref
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.exc import ArgumentError

from episodic.core.errors import InvalidInput
from episodic.storage import dbapi
from episodic.storage.dbapi import DriverSQL

SQLITE_BUSY_TIMEOUT_MS = 30_000
PG_LOCK_TIMEOUT_MS = 60_000  # bounds every lock wait, the pipeline's advisory lock included


def normalize_url(raw: str) -> URL:
    """Parse a database URL; bare ``postgresql://`` means psycopg 3 (the driver we ship)."""
    try:
        url = make_url(raw)
    except ArgumentError:
        raise InvalidInput("EPISODIC_DATABASE_URL is not a valid database URL") from None
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")
    if url.get_backend_name() not in ("sqlite", "postgresql"):
        raise InvalidInput(
            f"unsupported database backend {url.get_backend_name()!r} (sqlite or postgresql)"
        )
    if url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:"):
        raise InvalidInput("SQLite needs a database file (the pipeline lock lives next to it)")
    return url


def sqlite_path(url: URL) -> Path:
    assert url.database is not None
    return Path(url.database).absolute()


def database_label(target: Engine | Connection | URL) -> str:
    """How a message names the database it looked in: a SQLite database by its file's path,
    any other by its URL without password and without query (options may carry secrets)."""
    if isinstance(target, Connection):
        target = target.engine
    url = target.url if isinstance(target, Engine) else target
    if url.get_backend_name() == "sqlite":
        database = url.database or ""
        if database.startswith("file:"):  # a read-only engine's URI filename
            database = database.removeprefix("file:").split("?", 1)[0]
        return str(Path(database).absolute()) if database not in ("", ":memory:") else "memory"
    shown = URL.create(url.drivername, url.username, None, url.host, url.port, url.database)
    return shown.render_as_string(hide_password=False)


_writer_locks: dict[Path, threading.RLock] = {}
_writer_locks_guard = threading.Lock()
_engine_writer_locks: weakref.WeakKeyDictionary[Engine, threading.RLock] = (
    weakref.WeakKeyDictionary()
)


def writer_lock(engine: Engine) -> AbstractContextManager[Any]:
    """Hold while a SQLite write transaction is open, from ``BEGIN IMMEDIATE`` to its end.

    SQLite lets one writer in at a time and makes the others poll with growing sleeps (its
    busy handler), so threads of one process that queue on the database lock hand it over
    late: under 32 item threads a claim waited 15 ms for a lock held for well under one.
    Queuing on this process-wide lock first hands it over at once; other processes still
    meet at SQLite's lock. A no-op on other databases.
    """
    if engine.dialect.name != "sqlite":
        return nullcontext()
    lock = _engine_writer_locks.get(engine)  # per transaction: no path arithmetic
    if lock is not None:
        return lock
    path = sqlite_path(engine.url)
    with _writer_locks_guard:
        lock = _writer_locks.get(path)
        if lock is None:
            lock = _writer_locks[path] = threading.RLock()
        _engine_writer_locks[engine] = lock
    return lock


def make_engine(raw_url: str | URL, *, read_only: bool = False, **kwargs: Any) -> Engine:
    url = normalize_url(raw_url) if isinstance(raw_url, str) else raw_url
    if url.get_backend_name() == "sqlite":
        return _sqlite_engine(url, read_only=read_only, **kwargs)
    # No pool_pre_ping: it costs a round trip per checkout, and a dropped connection surfaces
    # as an OperationalError that callers retry (SQLAlchemy invalidates the pool on it).
    options = f"-c lock_timeout={PG_LOCK_TIMEOUT_MS}"
    if read_only:
        options += " -c default_transaction_read_only=on"
    return create_engine(url, connect_args={"options": options}, **kwargs)


_BEGIN = DriverSQL("BEGIN DEFERRED")
_BEGIN_IMMEDIATE = DriverSQL("BEGIN IMMEDIATE")


def _sqlite_engine(url: URL, *, read_only: bool, **kwargs: Any) -> Engine:
    path = sqlite_path(url)
    if read_only:
        if not path.is_file():  # a reader never creates one; say which file it looked for
            from episodic.core.errors import StorageError

            raise StorageError(f"no database at {path}: the SQLite file does not exist")
        url = url.set(database=f"file:{path}?mode=ro", query={"uri": "true"})
    else:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            from episodic.core.errors import InvalidInput

            raise InvalidInput(
                f"SQLite database {path}: its folder cannot be created ({exc.strerror})"
            ) from None
    engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}, **kwargs)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # we emit BEGIN ourselves
        cursor = dbapi_connection.cursor()
        if not read_only:
            cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        mode = connection.get_execution_options().get("sqlite_begin", "DEFERRED")
        # on the driver: a statement through Core costs about ten times more (storage/dbapi.py)
        dbapi.rowcount(connection, _BEGIN_IMMEDIATE if mode == "IMMEDIATE" else _BEGIN, {})

    return engine
