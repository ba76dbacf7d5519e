"""Migrations: `alembic upgrade head` on an empty database matches the models (both backends)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, inspect

from core.errors import SchemaNotCurrent
from storage.base import Base
from storage.engine import make_engine
from storage.schema import HEAD_REVISION, alembic_config, current_revision, ensure_schema, upgrade
from tests.databases import PostgresDatabases, SqliteDatabases


@pytest.fixture
def empty_engine(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
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


def test_upgrade_head_on_an_empty_database_matches_the_models(empty_engine: Engine) -> None:
    assert current_revision(empty_engine) is None
    upgrade(empty_engine)
    assert current_revision(empty_engine) == HEAD_REVISION
    with empty_engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(context, Base.metadata)
    assert diff == []
    assert set(inspect(empty_engine).get_table_names()) >= {"episodes", "episode_events"}


def test_upgrade_is_idempotent(empty_engine: Engine) -> None:
    upgrade(empty_engine)
    upgrade(empty_engine)
    assert current_revision(empty_engine) == HEAD_REVISION


def test_head_revision_constant_matches_the_scripts() -> None:
    assert ScriptDirectory.from_config(alembic_config()).get_current_head() == HEAD_REVISION


def test_server_databases_are_not_migrated_behind_the_operators_back(
    empty_engine: Engine,
) -> None:
    if empty_engine.dialect.name == "sqlite":
        ensure_schema(empty_engine, auto_upgrade=True)  # the embedded default migrates itself
        assert current_revision(empty_engine) == HEAD_REVISION
        return
    with pytest.raises(SchemaNotCurrent, match="episodic db upgrade"):
        ensure_schema(empty_engine, auto_upgrade=False)
