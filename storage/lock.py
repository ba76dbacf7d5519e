"""The pipeline lock: one writer at a time per pipeline, across processes and machines.

Postgres: ``pg_advisory_xact_lock`` on a 64-bit key derived from the pipeline name. It is a
*transaction* lock, released by commit or rollback; a session-level lock would survive a
rollback and break under transaction pooling.

SQLite: a `filelock` on a file next to the database (one per pipeline), held for the whole
transaction, plus ``BEGIN IMMEDIATE`` so the database write lock is taken up front.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock
from sqlalchemy import Connection, Engine, text

from storage.engine import sqlite_path

LOCK_TIMEOUT_S = 60.0


def advisory_key(name: str) -> int:
    """A signed 64-bit integer derived from ``name`` (the range of a Postgres bigint)."""
    digest = hashlib.sha256(f"episodic:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def pipeline_lock_path(engine: Engine, pipeline: str) -> Path:
    digest = hashlib.sha256(pipeline.encode()).hexdigest()[:16]
    db = sqlite_path(engine.url)
    return db.with_name(f"{db.name}.pipeline-{digest}.lock")


@contextmanager
def locked_transaction(
    engine: Engine, pipeline: str, timeout: float = LOCK_TIMEOUT_S
) -> Iterator[Connection]:
    """A connection inside a transaction that holds the pipeline lock until it ends.

    Commits when the block exits normally, rolls back on error.
    """
    if engine.dialect.name == "sqlite":
        with FileLock(pipeline_lock_path(engine, pipeline), timeout=timeout):
            with engine.connect().execution_options(sqlite_begin="IMMEDIATE") as conn:
                with conn.begin():
                    yield conn
        return
    with engine.connect() as conn, conn.begin():
        conn.execute(
            text("SELECT set_config('lock_timeout', :t, true)"), {"t": f"{int(timeout * 1000)}ms"}
        )
        conn.execute(
            text("SELECT pg_advisory_xact_lock(:k)"), {"k": advisory_key(f"pipeline:{pipeline}")}
        )
        yield conn
