"""The ledger's hot statements on the bare driver (storage/dbapi.py), on both backends: their
values mean what the schema's types mean, and their errors are SQLAlchemy's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from sqlalchemy import Engine, create_engine, select, text, update
from sqlalchemy.exc import DBAPIError, IntegrityError

from episodic.core.errors import RunNotFound
from episodic.storage import dbapi, tx
from episodic.storage.dbapi import DriverSQL
from episodic.storage.models import ItemRow
from episodic.storage.runs import RunStore
from tests.databases import terminate_other_sessions
from tests.generation import new_episode, new_run, write_playlist

_items = ItemRow.__table__


def _an_item(engine: Engine, tmp_path) -> int:  # type: ignore[no-untyped-def]
    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "pl", ["one"]))
    new_run(episode)
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT min(id) FROM items")).scalar_one())


@pytest.mark.parametrize(
    "moment",
    [
        datetime(2026, 8, 3, 12, 0, 0, tzinfo=UTC),  # no microseconds: isoformat would drop them
        datetime(2026, 8, 3, 12, 0, 0, 1, tzinfo=UTC),
        datetime(2026, 8, 3, 14, 30, 0, 999999, tzinfo=timezone(timedelta(hours=2))),
    ],
)
def test_a_moment_written_on_the_driver_reads_and_orders_as_the_schema_type(
    engine: Engine, tmp_path, moment: datetime
) -> None:  # type: ignore[no-untyped-def]
    pk = _an_item(engine, tmp_path)
    write = DriverSQL("UPDATE items SET lease_expires_at = :at WHERE id = :pk")
    with tx.write(engine) as conn:
        assert dbapi.rowcount(conn, write, {"at": moment, "pk": pk}) == 1
    with engine.connect() as conn:  # through the schema's type
        stored = conn.execute(select(_items.c.lease_expires_at).where(_items.c.id == pk)).scalar()
    assert stored == moment and stored.tzinfo is not None
    later = DriverSQL("SELECT count(*) FROM items WHERE id = :pk AND lease_expires_at > :at")
    with tx.read(engine) as conn:  # compared in SQL against the same instant, a microsecond off
        assert dbapi.scalar(conn, later, {"pk": pk, "at": moment - timedelta(microseconds=1)}) == 1
        assert dbapi.scalar(conn, later, {"pk": pk, "at": moment}) == 0
    with tx.write(engine) as conn:  # written through the schema's type, read on the driver
        conn.execute(update(_items).where(_items.c.id == pk).values(lease_expires_at=moment))
    with tx.read(engine) as conn:
        raw = dbapi.scalar(
            conn, DriverSQL("SELECT lease_expires_at FROM items WHERE id = :pk"), {"pk": pk}
        )
        assert dbapi.moment(raw) == moment
        assert dbapi.scalar(conn, later, {"pk": pk, "at": moment}) == 0


def test_a_naive_moment_is_refused_before_it_is_sent(engine: Engine) -> None:
    with tx.read(engine) as conn, pytest.raises(ValueError, match="naive"):
        dbapi.scalar(conn, DriverSQL("SELECT :at"), {"at": datetime(2026, 1, 1)})


def test_a_driver_error_is_raised_as_sqlalchemys(engine: Engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    pk = _an_item(engine, tmp_path)
    duplicate = DriverSQL(
        "INSERT INTO items (episode_pk, idempotency_key, position, video_id, prompt, state, "
        "attempts, force_resubmit, created_at) SELECT episode_pk, idempotency_key, position, "
        "video_id, prompt, state, attempts, force_resubmit, created_at FROM items WHERE id = :pk"
    )
    with pytest.raises(IntegrityError) as caught, tx.write(engine) as conn:
        dbapi.rowcount(conn, duplicate, {"pk": pk})
    assert not caught.value.connection_invalidated
    assert not tx.is_lost_connection(caught.value)
    with tx.read(engine) as conn:  # the pool is fine afterwards
        assert dbapi.scalar(conn, DriverSQL("SELECT count(*) FROM items"), {}) == 1


@pytest.mark.parametrize("backend", ["postgres"])
def test_a_lost_connection_is_invalidated_and_seen_as_lost(engine: Engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    _an_item(engine, tmp_path)
    with tx.read(engine) as conn:
        pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
    admin = create_engine(engine.url, isolation_level="AUTOCOMMIT")
    with admin.connect() as other:
        other.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid})
    admin.dispose()
    with pytest.raises(DBAPIError) as caught, tx.read(engine) as conn:
        dbapi.scalar(conn, DriverSQL("SELECT count(*) FROM items"), {})
    assert caught.value.connection_invalidated
    assert tx.is_lost_connection(caught.value)  # what the stores' outage retries look for
    with pytest.raises(RunNotFound):  # answered: the pool made a new connection
        RunStore(engine).run_state("no-such-run")


@pytest.mark.parametrize("backend", ["postgres"])
def test_a_lost_connection_makes_the_pool_replace_every_older_one(engine: Engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A restarted server ends every pooled connection: after the first statement that finds
    its connection lost, the others are replaced at checkout instead of each failing in turn
    (as SQLAlchemy's own execution does; otherwise five stale pooled connections would fail
    one after the other on the advisory lock of a locked write)."""
    from episodic.storage.locks import keyed_transaction

    _an_item(engine, tmp_path)
    held = [engine.connect() for _ in range(5)]  # five connections in the pool
    for conn in held:
        conn.execute(text("SELECT 1"))
    for conn in held:
        conn.close()
    assert terminate_other_sessions(engine) == 5
    outcomes = []
    for _ in range(4):
        try:
            with keyed_transaction(engine, "dispatch:pool") as conn:  # the lock comes first
                dbapi.scalar(conn, DriverSQL("SELECT count(*) FROM items"), {})
            outcomes.append("ok")
        except DBAPIError as exc:
            assert tx.is_lost_connection(exc)
            outcomes.append("lost")
    assert outcomes == ["lost", "ok", "ok", "ok"]
