"""Fixtures of the integration tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from episodic.storage.engine import make_engine
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


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A state folder of the test's own for the `episodic` command (`standin_cli.cli`), the
    providers file beside it, the Replicate stand-in's token in ``REPLICATE_KEY`` and fal's in
    ``FAL_KEY``."""
    from tests.standins import fal as fal_standin
    from tests.standins import replicate as replicate_standin

    monkeypatch.setenv("EPISODIC_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("EPISODIC_DATABASE_URL", raising=False)
    monkeypatch.setenv("EPISODIC_PROVIDERS_FILE", str(tmp_path / "providers.yaml"))
    monkeypatch.setenv("REPLICATE_KEY", replicate_standin.TOKEN)
    monkeypatch.setenv("FAL_KEY", fal_standin.TOKEN)
    yield tmp_path
