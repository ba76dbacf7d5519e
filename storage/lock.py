"""The pipeline lock: one writer at a time per pipeline, across processes and machines.

Postgres: ``pg_advisory_xact_lock`` on a 64-bit key derived from the pipeline name. It is a
*transaction* lock, released by commit or rollback; a session-level lock would survive a
rollback and break under transaction pooling.

SQLite: a `filelock` on a file next to the database (one per pipeline), held for the whole
transaction, plus ``BEGIN IMMEDIATE`` so the database write lock is taken up front.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock
from sqlalchemy import Connection, Engine

from storage.engine import sqlite_path, writer_lock
from storage.tx import advisory_xact_lock, tracked_commit
from storage.tx import write as write_transaction

LOCK_TIMEOUT_S = 60.0
# filelock polls a held lock; its default 50 ms poll turned a 1 ms critical section into tens
# of milliseconds of waiting under contention.
LOCK_POLL_INTERVAL_S = 0.002


def pipeline_lock_path(engine: Engine, pipeline: str) -> Path:
    digest = hashlib.sha256(pipeline.encode()).hexdigest()[:16]
    db = sqlite_path(engine.url)
    return db.with_name(f"{db.name}.pipeline-{digest}.lock")


@functools.lru_cache(maxsize=256)
def _file_lock(engine: Engine, pipeline: str) -> FileLock:
    """One reentrant lock object per lock file per process (building one is not free)."""
    return FileLock(pipeline_lock_path(engine, pipeline))


@contextmanager
def locked_transaction(
    engine: Engine, pipeline: str, timeout: float = LOCK_TIMEOUT_S
) -> Iterator[Connection]:
    """A connection inside a transaction that holds the pipeline lock until it ends.

    Commits when the block exits normally, rolls back on error.
    """
    if engine.dialect.name == "sqlite":
        with (
            tracked_commit() as body_done,
            _file_lock(engine, pipeline).acquire(
                timeout=timeout, poll_interval=LOCK_POLL_INTERVAL_S
            ),
            writer_lock(engine),
            engine.connect().execution_options(sqlite_begin="IMMEDIATE") as conn,
            conn.begin(),
        ):
            yield conn
            body_done[0] = True
        return
    # The wait is bounded by the connection's lock_timeout (see storage.engine).
    with tracked_commit() as body_done, engine.connect() as conn, conn.begin():
        advisory_xact_lock(conn, f"pipeline:{pipeline}")
        yield conn
        body_done[0] = True


@contextmanager
def keyed_transaction(engine: Engine, name: str) -> Iterator[Connection]:
    """A write transaction serialized with every other one on `name`, across processes.

    Postgres: ``pg_advisory_xact_lock`` on a key derived from `name`. SQLite: the database
    write lock itself (``BEGIN IMMEDIATE``), which already serializes every writer; no lock
    file per name is left behind.
    """
    with write_transaction(engine, lock=name) as conn:
        yield conn
