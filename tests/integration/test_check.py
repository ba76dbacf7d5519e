"""The read-only checker on SQLite and Postgres."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from sqlalchemy import Engine, delete, select, text
from sqlalchemy.engine import make_url

from core.settings import load_settings
from pipeline.check import check_episodes
from pipeline.review import assemble, decide
from storage.engine import make_engine
from storage.models import CostEntryRow, ItemRow
from tests.generation import Episode, new_episode, write_playlist


@pytest.fixture
def assembled(engine: Engine, database_url: str, tmp_path: Path) -> Episode:
    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "p", ["a", "b"]))
    episode.generate()
    decide(engine, "weekly", episode.episode_id, approve=True, by="ann", note=None)
    assemble(engine, load_settings(), "weekly", episode.episode_id)
    return episode


def read_only_engine(database_url: str, request: pytest.FixtureRequest) -> Engine:
    """SQLite: mode=ro on a file without write permission; Postgres: a SELECT-only role."""
    url = make_url(database_url)
    if url.get_backend_name() == "sqlite":
        path = Path(str(url.database))
        os.chmod(path, 0o444)
        request.addfinalizer(lambda: os.chmod(path, 0o644))
        return make_engine(database_url, read_only=True)
    role = f"episodic_ro_{uuid.uuid4().hex[:8]}"
    admin = make_engine(database_url)
    with admin.begin() as conn:
        conn.execute(text(f"CREATE ROLE {role} LOGIN"))
        conn.execute(text(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}"))
    admin.dispose()

    def drop() -> None:
        cleanup = make_engine(database_url)
        with cleanup.begin() as conn:
            conn.execute(text(f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {role}"))
            conn.execute(text(f"DROP OWNED BY {role}"))
        cleanup.dispose()
        other = make_engine(url.set(database="postgres").render_as_string(hide_password=False))
        with other.begin() as conn:
            conn.execute(text(f"DROP ROLE IF EXISTS {role}"))
        other.dispose()

    request.addfinalizer(drop)
    return make_engine(url.set(username=role).render_as_string(hide_password=False), read_only=True)


def test_clean_data_passes_read_only_and_nothing_is_written(
    assembled: Episode, database_url: str, request: pytest.FixtureRequest
) -> None:
    home = load_settings().home_path
    files = sorted(p for p in home.rglob("*") if p.is_file())
    before = {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in files}
    ro = read_only_engine(database_url, request)
    assert check_episodes(ro, "weekly") == []
    assert check_episodes(ro, "weekly", assembled.episode_id) == []
    ro.dispose()
    after = {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in files}
    assert after == before
    assert sorted(p for p in home.rglob("*") if p.is_file()) == files


def test_tampered_and_missing_files_are_found(assembled: Episode) -> None:
    with assembled.engine.connect() as conn:
        first, second = conn.execute(select(ItemRow.output_path).order_by(ItemRow.id)).scalars()
    Path(first).write_bytes(b"not the image we paid for")
    Path(second).unlink()
    (load_settings().episodes_path / assembled.episode_id / "cover.png").write_bytes(b"x")
    findings = check_episodes(assembled.engine, "weekly")
    details = [f"{f.check}: {f.detail}" for f in findings]
    assert any("v01.p1 does not match" in d for d in details)
    assert any("v02.p1 is missing" in d for d in details)
    assert any(d.startswith("files: cover does not match") for d in details)


def test_a_ledger_mismatch_is_found(assembled: Episode) -> None:
    with assembled.engine.begin() as conn:
        conn.execute(
            delete(CostEntryRow).where(
                CostEntryRow.id
                == select(CostEntryRow.id).order_by(CostEntryRow.id).limit(1).scalar_subquery()
            )
        )
    findings = check_episodes(assembled.engine, "weekly")
    assert [f.check for f in findings] == ["ledger"]
    assert "0 cost entries, expected 1" in findings[0].detail
