"""The database side of `episodic dispatch` (`episodic.flows.dispatch`): dispatchers of one request
serialized across processes and machines, so two of them never both start a flow run."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine

from episodic.storage.locks import keyed_transaction


@contextmanager
def one_dispatcher(engine: Engine, fingerprint: str) -> Iterator[None]:
    """Hold, for the block, the lock of the request `fingerprint` (`core.dedup`): an advisory
    transaction lock on the key ``dispatch:FINGERPRINT`` on Postgres, the write lock on
    SQLite. Released when the block ends, normally or by an exception."""
    with keyed_transaction(engine, f"dispatch:{fingerprint}"):
        yield
