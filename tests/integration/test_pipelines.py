"""Two pipelines never share a row or a file, and the migration that
re-keys items of existing non-default pipelines pays nothing again. SQLite and Postgres."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine, select, text

from episodic.core.ids import WeekId
from episodic.core.planning import RunOptions
from episodic.core.settings import load_settings
from episodic.pipeline.allocation import allocate
from episodic.pipeline.check import check_episodes
from episodic.pipeline.episode_plan import record_plan
from episodic.pipeline.gate import EnvironmentCredentials
from episodic.pipeline.generation import generate
from episodic.storage.models import ItemRow
from tests.generation import image_keys, jobs_per_key, write_playlist


@pytest.fixture(autouse=True)
def fake_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))


def _generate(engine: Engine, pipeline: str, episode_id: str) -> object:
    return generate(
        engine, load_settings(), pipeline, episode_id, RunOptions(), EnvironmentCredentials()
    )


def test_the_same_episode_id_in_two_pipelines_shares_nothing(
    engine: Engine, tmp_path: Path
) -> None:
    playlist = write_playlist(tmp_path / "pl", ["a", "b"])
    for pipeline in ("weekly", "other"):
        episode = allocate(engine, pipeline, WeekId.parse("2026-W35"), "k").episode
        assert str(episode.episode_id) == "2026-W35-0"
        record_plan(engine, pipeline, "2026-W35-0", playlist)  # no UNIQUE error
        assert _generate(engine, pipeline, "2026-W35-0").exit_code == 0  # type: ignore[attr-defined]
    with engine.connect() as conn:
        keys = list(conn.execute(select(ItemRow.output_key)).scalars())
    stored = image_keys(engine)  # each item's own row, its image verified in the store
    assert len(keys) == len(stored) == 4
    assert len(set(keys)) == 2  # the same prompt and seed drew the same bytes: stored once
    assert set(jobs_per_key().values()) == {1} and len(jobs_per_key()) == 4
    assert check_episodes(engine, "weekly") == [] and check_episodes(engine, "other") == []


def test_upgrading_rekeys_existing_items_of_other_pipelines_and_pays_nothing(
    engine: Engine, database_url: str, tmp_path: Path
) -> None:
    """An `other` pipeline episode generated before keys were scoped (simulated: its items
    re-keyed back with the migration's downgrade), then upgraded: generate pays nothing."""
    from episodic.storage.schema import downgrade, upgrade

    playlist = write_playlist(tmp_path / "pl", ["a", "b"])
    allocate(engine, "other", WeekId.parse("2026-W35"), "k")
    record_plan(engine, "other", "2026-W35-0", playlist)
    assert _generate(engine, "other", "2026-W35-0").exit_code == 0  # type: ignore[attr-defined]
    with engine.connect() as conn:
        scoped = sorted(conn.execute(select(ItemRow.idempotency_key)).scalars())

    downgrade(engine, "0005")
    with engine.connect() as conn:
        old = sorted(conn.execute(select(ItemRow.idempotency_key)).scalars())
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == "0005"
    assert set(old).isdisjoint(scoped)  # the keys as they were before scoping
    upgrade(engine)
    with engine.connect() as conn:
        assert sorted(conn.execute(select(ItemRow.idempotency_key)).scalars()) == scoped
    again = _generate(engine, "other", "2026-W35-0")
    assert again.run_id is None and again.exit_code == 0  # type: ignore[attr-defined]
    assert set(jobs_per_key().values()) == {1} and len(jobs_per_key()) == 2
