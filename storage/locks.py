"""The lock protocol: which locks a write transaction takes, and in which order.

Every write transaction follows one order, so no two of them wait for each other in a
cycle (a deadlock: Postgres aborts one of them after ``deadlock_timeout``):

1. **Named advisory locks** (Postgres ``pg_advisory_xact_lock`` on a 64-bit key
   derived from the name, `tx.advisory_key`; a *transaction* lock, released by commit or
   rollback: a session lock would survive a rollback and break under transaction pooling),
   taken first, by `tx.write(lock=…)`, `keyed_transaction` or `locked_transaction`:

   - ``pipeline:{name}``: one writer at a time per pipeline (allocation, `storage.pipelines`);
   - ``run:{fingerprint}``: admitting a run of one request (`episodic.storage.admission`), so two
     callers never both see "no run" and both insert;
   - ``provider:{profile}``: a claim that counts a profile's provider slots
     (`episodic.storage.claims`), so concurrent claimers never both take the last one;
   - ``spend:{run_id}`` and ``budget:{pipeline}``: a claim or a re-buy that holds a run's
     caps or its pipeline's period budgets against its money (`episodic.storage.budgets`), so
     concurrent claimers never both take the last of a budget;
   - ``dispatch:{fingerprint}``, ``approval-wait:{pipeline}:{episode}`` (flows), ``schema``
     (migrations).

   Most transactions take one. The claim takes several (its provider, spend and budget
   names) and `tx.write` takes them all first, in ascending key order (`tx.advisory_key`):
   the one global order, so no transaction holding a named lock waits for one that a
   waiter of its own holds.

2. **Membership locks** ``membership:{episode_pk}`` (`lock_membership`), for several episodes
   in ascending pk: every transaction that changes, or decides from, which runs include an
   episode's items (admitting a run, cancelling a run or its orphaned items, abandoning a
   pending run, the sweep, deciding a provider-side cancel). Taken after the named lock only,
   before any row lock.

3. **Row locks**, in this order: a run's row before any item row (a cancel and the sweep
   cancel the run, then its items; a claim decides the run before it locks items; a renewal
   extends the run's lease first); an episode's row (``FOR UPDATE``: recording a plan, marking
   the episode generated) before its items'; several item rows always in ascending id
   (`in_id_order`, and the claim of a batch locks its rows so first), with ``FOR NO KEY
   UPDATE``, which leaves the foreign-key checks of rows referring to them free.

SQLite has one writer at a time: a write transaction takes the database's write lock up
front (``BEGIN IMMEDIATE``), after this process's writer lock (`storage.engine.writer_lock`,
which hands the lock over between threads at once instead of SQLite's polling), so the
advisory, membership and row locks above are no-ops there; the pipeline lock adds a
`filelock` next to the database for the whole transaction.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock
from sqlalchemy import ColumnElement, Connection, Engine, Table, select

from episodic.storage.engine import sqlite_path, writer_lock
from episodic.storage.tx import advisory_xact_lock, tracked_commit
from episodic.storage.tx import write as write_transaction

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
    """A connection inside a transaction that holds the pipeline lock (one writer at a time
    per pipeline, across processes and machines) until it ends: on Postgres the advisory lock
    ``pipeline:{name}``, on SQLite a `filelock` next to the database (one per pipeline) held
    for the whole transaction, plus ``BEGIN IMMEDIATE``.

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


def lock_membership(conn: Connection, episode_pks: Iterable[int]) -> None:
    """Step 2 of the protocol above: serialize this transaction with every other one that
    changes, or decides from, which runs include the items of these episodes.

    Postgres: one ``pg_advisory_xact_lock`` per episode (re-entrant within a transaction).
    Without it, under READ COMMITTED, a cancel that read "no live run includes this item"
    before a new run committed then cancelled that run's items; and two creations
    restarting the same cancelled items deadlocked (inserting a membership takes a share
    lock on the item, which the other transaction then needs to update). Taken after a
    row, it would deadlock with a transaction that holds it and waits for that row (a
    changed plan locks the episode's row; a new run's foreign key needs a share lock on
    it). SQLite: its writer lock already serializes them.
    """
    if conn.dialect.name != "postgresql":
        return
    for pk in sorted(set(episode_pks)):
        advisory_xact_lock(conn, f"membership:{pk}")


def in_id_order(table: Table, which: ColumnElement[bool]) -> ColumnElement[bool]:
    """`which` for an UPDATE of several rows of `table`, with those rows locked first in
    ascending ``id`` order (``id IN (SELECT id … ORDER BY id FOR NO KEY UPDATE)`` on Postgres:
    the lock an UPDATE of non-key columns takes, which leaves foreign-key checks of rows
    referring to them free; SQLite renders none: its writer lock serializes every writer).

    Step 3 of the protocol above: an UPDATE locks the rows it changes in the order it happens
    to scan them, so two transactions changing overlapping rows could each hold one the
    other waits for (a deadlock, one of them aborted after a second). Creating a run (whose
    membership inserts take share locks on its items before it updates them) holds
    `lock_membership` first.
    """
    return table.c.id.in_(
        select(table.c.id).where(which).order_by(table.c.id).with_for_update(key_share=True)
    )
