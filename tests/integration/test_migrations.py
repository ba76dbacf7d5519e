"""Migrations: `alembic upgrade head` on an empty database matches the models (both backends)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, inspect, text
from sqlalchemy.exc import IntegrityError

from core.errors import SchemaNotCurrent
from storage.base import Base
from storage.engine import make_engine
from storage.installation import ID, installation_id
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


# ---------------------------------------------------------------- 0012: the installation id
def _installation_rows(engine: Engine) -> list[tuple[int, str]]:
    with engine.connect() as conn:
        return [
            (row[0], row[1])
            for row in conn.execute(text("SELECT singleton, id FROM installation")).all()
        ]


def test_upgrade_makes_exactly_one_installation_id_that_upgrades_and_restarts_keep(
    empty_engine: Engine,
) -> None:
    upgrade(empty_engine)
    ((singleton, first),) = _installation_rows(empty_engine)
    assert singleton == 1 and ID.fullmatch(first)
    upgrade(empty_engine)  # a repeated upgrade (every `episodic db upgrade`) keeps it
    empty_engine.dispose()  # a restart: a new process's engine reads the same row
    again = make_engine(empty_engine.url)
    try:
        assert _installation_rows(again) == [(1, first)]
        assert installation_id(again) == first
        with pytest.raises(IntegrityError), again.begin() as conn:  # never a second row
            conn.execute(
                text("INSERT INTO installation VALUES (2, 'ffffffffffffffff', '2026-01-01')")
            )
    finally:
        again.dispose()


def test_two_databases_upgraded_from_empty_have_different_installation_ids(
    empty_engine: Engine, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    other = make_engine(f"sqlite:///{tmp_path / 'other.db'}")
    try:
        upgrade(empty_engine)
        upgrade(other)
        assert installation_id(empty_engine) != installation_id(other)
    finally:
        other.dispose()


def test_downgrade_from_0012_drops_the_installation_and_upgrade_makes_it_again(
    empty_engine: Engine,
) -> None:
    from alembic import command

    upgrade(empty_engine)
    before = installation_id(empty_engine)
    config = alembic_config()
    with empty_engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0011")
    assert current_revision(empty_engine) == "0011"
    assert "installation" not in inspect(empty_engine).get_table_names()
    upgrade(empty_engine)
    assert current_revision(empty_engine) == HEAD_REVISION
    ((_one, after),) = _installation_rows(empty_engine)
    assert ID.fullmatch(after) and after != before  # a new installation; rows keep their refs
