"""A write transaction naming several locks holds every one of them until it ends (PostgreSQL
advisory transaction locks, taken in one statement)."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, text

from episodic.storage import tx

NAMES = ["run:r1", "pipeline:weekly", "provider:bench", "run:r1"]  # a duplicate is taken once


def _free(engine: Engine, name: str) -> bool:
    """Whether another session could take `name` now (it does not wait: it tries)."""
    with engine.connect() as other:
        return bool(
            other.execute(
                text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": tx.advisory_key(name)}
            ).scalar_one()
        )


@pytest.mark.parametrize("backend", [pytest.param("postgres", marks=pytest.mark.postgres)])
def test_every_named_lock_is_held_until_the_transaction_ends(engine: Engine) -> None:
    with tx.write(engine, lock=NAMES) as conn:
        held = conn.execute(
            text(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
                "AND pid = pg_backend_pid()"
            )
        ).scalar_one()
        assert held == 3
        assert not any(_free(engine, name) for name in set(NAMES))
        assert _free(engine, "run:r2")  # only the named ones
    assert all(_free(engine, name) for name in set(NAMES))
