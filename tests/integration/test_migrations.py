"""Migrations: `alembic upgrade head` on an empty database matches the models (both backends)."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, inspect, text
from sqlalchemy.exc import IntegrityError

from episodic.core.errors import SchemaNotCurrent
from episodic.storage.base import Base
from episodic.storage.engine import make_engine
from episodic.storage.installation import ID, installation_id
from episodic.storage.schema import (
    HEAD_REVISION,
    alembic_config,
    current_revision,
    downgrade,
    ensure_schema,
    upgrade,
)


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
    upgrade(empty_engine)
    before = installation_id(empty_engine)
    downgrade(empty_engine, "0011")
    assert current_revision(empty_engine) == "0011"
    assert "installation" not in inspect(empty_engine).get_table_names()
    upgrade(empty_engine)
    assert current_revision(empty_engine) == HEAD_REVISION
    ((_one, after),) = _installation_rows(empty_engine)
    assert ID.fullmatch(after) and after != before  # a new installation; rows keep their refs


# ------------------------------------------------------------ 0013: media store keys
def _columns(engine: Engine, table: str) -> dict[str, bool]:
    return {c["name"]: bool(c["nullable"]) for c in inspect(engine).get_columns(table)}


def _downgrade(engine: Engine, revision: str) -> None:
    downgrade(engine, revision)


def _legacy_rows(engine: Engine) -> None:
    """An episode with one completed item and its cover as written before the store: an
    absolute path each, no key."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO episodes (id, pipeline, week_id, sequence, episode_id, state, "
                "allocation_key, created_at, updated_at) VALUES (1, 'default', '2026-W30', 1, "
                "'2026-W30-01', 'assembled', 'k', '2026-01-01', '2026-01-01')"
            )
        )
        conn.execute(
            text(
                "INSERT INTO items (id, episode_pk, idempotency_key, position, video_id, part, "
                "prompt, seed, state, attempts, output_path, output_sha256, force_resubmit, "
                "created_at) VALUES (1, 1, 'key1', 1, 'v01', 1, 'p', 1, 'completed', 1, "
                f"'/old/v01.png', '{'a' * 64}', false, '2026-01-01')"
            )
        )
        conn.execute(
            text(
                "INSERT INTO episode_media (episode_pk, kind, path, sha256, recorded_at) "
                f"VALUES (1, 'cover', '/old/cover.png', '{'b' * 64}', '2026-01-01')"
            )
        )


def test_0013_adds_store_keys_and_keeps_legacy_paths_of_existing_rows(
    empty_engine: Engine,
) -> None:
    upgrade(empty_engine, "0012")
    assert "output_key" not in _columns(empty_engine, "items")
    assert _columns(empty_engine, "episode_media")["path"] is False
    _legacy_rows(empty_engine)
    upgrade(empty_engine)
    items = _columns(empty_engine, "items")
    media = _columns(empty_engine, "episode_media")
    for name in ("output_key", "output_size", "output_media_type", "output_path"):
        assert items[name] is True
    for name in ("key", "size", "media_type", "path"):
        assert media[name] is True
    with empty_engine.connect() as conn:
        item = conn.execute(text("SELECT output_key, output_path, output_sha256 FROM items")).one()
        cover = conn.execute(text("SELECT key, path, sha256 FROM episode_media")).one()
    assert tuple(item) == (None, "/old/v01.png", "a" * 64)
    assert tuple(cover) == (None, "/old/cover.png", "b" * 64)
    with empty_engine.begin() as conn:  # a row of the store: a key, and no path
        conn.execute(
            text(
                "INSERT INTO episode_media (episode_pk, kind, key, size, media_type, sha256, "
                f"recorded_at) VALUES (1, 'manifest', 'sha256/cc/x.json', 10, "
                f"'application/json', '{'c' * 64}', '2026-01-01')"
            )
        )


def test_downgrade_from_0013_drops_the_key_columns_and_keeps_legacy_paths(
    empty_engine: Engine,
) -> None:
    upgrade(empty_engine)
    _legacy_rows(empty_engine)
    _downgrade(empty_engine, "0012")
    assert current_revision(empty_engine) == "0012"
    assert "output_key" not in _columns(empty_engine, "items")
    assert "key" not in _columns(empty_engine, "episode_media")
    assert _columns(empty_engine, "episode_media")["path"] is False
    with empty_engine.connect() as conn:
        assert conn.execute(text("SELECT output_path FROM items")).scalar_one() == "/old/v01.png"
    upgrade(empty_engine)
    assert current_revision(empty_engine) == HEAD_REVISION


# ------------------------------------------------------------ 0015: the recorded media store
def test_0015_adds_an_empty_media_store_record_of_one_row_at_most_and_downgrade_drops_it(
    empty_engine: Engine,
) -> None:
    upgrade(empty_engine, "0014")
    assert "media_store" not in inspect(empty_engine).get_table_names()
    upgrade(empty_engine)
    with empty_engine.connect() as conn:  # nothing recorded: the first writer adopts a store
        assert conn.execute(text("SELECT count(*) FROM media_store")).scalar_one() == 0
    row = "(1, '6f1c1b1e-0000-4000-8000-000000000001', 's3://b/p', '2026-01-01')"
    with empty_engine.begin() as conn:
        conn.execute(text(f"INSERT INTO media_store VALUES {row}"))
    for other in ("(1, 'x', 's3://b/q', '2026-01-01')", "(2, 'x', 's3://b/q', '2026-01-01')"):
        with pytest.raises(IntegrityError), empty_engine.begin() as conn:
            conn.execute(text(f"INSERT INTO media_store VALUES {other}"))
    upgrade(empty_engine)  # upgrading again keeps the record
    with empty_engine.connect() as conn:
        assert conn.execute(text("SELECT url FROM media_store")).scalars().all() == ["s3://b/p"]
    _downgrade(empty_engine, "0014")
    assert current_revision(empty_engine) == "0014"
    assert "media_store" not in inspect(empty_engine).get_table_names()
