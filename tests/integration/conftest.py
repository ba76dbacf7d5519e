"""Fixtures of the integration tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from storage.engine import make_engine
from tests.databases import PostgresDatabases, SqliteDatabases


@pytest.fixture
def empty_engine(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    """An empty database (no migration run) on the test's backend, dropped after it."""
    if backend == "sqlite":
        databases: SqliteDatabases = request.getfixturevalue("sqlite_databases")
        engine = make_engine(databases.fresh(tmp_path / "empty", migrated=False))
        yield engine
        engine.dispose()
        return
    pg: PostgresDatabases = request.getfixturevalue("postgres_databases")
    name = pg.fresh(migrated=False)
    engine = make_engine(pg.url(name))
    yield engine
    engine.dispose()
    pg.drop(name)
