"""The allocator, on SQLite (filelock + BEGIN IMMEDIATE) and Postgres (advisory xact lock)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from sqlalchemy import Engine, func, select, text, update

from core.errors import AllocationConflict, InvalidInput
from core.ids import WeekId
from storage.allocator import Allocator
from storage.episodes import EpisodeRepository
from storage.models import EpisodeEventRow, EpisodeRow

W32 = WeekId.parse("2026-W32")
W33 = WeekId.parse("2026-W33")


def counts(engine: Engine) -> tuple[int, int]:
    with engine.connect() as conn:
        episodes = conn.execute(select(func.count()).select_from(EpisodeRow)).scalar_one()
        events = conn.execute(select(func.count()).select_from(EpisodeEventRow)).scalar_one()
    return episodes, events


def test_sequences_increment_within_a_week_and_reset_in_the_next(engine: Engine) -> None:
    allocator = Allocator(engine)
    ids = [str(allocator.allocate("weekly", W32, f"k{i}").episode.episode_id) for i in range(3)]
    assert ids == ["2026-W32-0", "2026-W32-1", "2026-W32-2"]
    assert str(allocator.allocate("weekly", W33, "next").episode.episode_id) == "2026-W33-0"
    assert str(allocator.allocate("weekly", W32, "k3").episode.episode_id) == "2026-W32-3"


def test_the_same_key_returns_the_same_episode_after_a_retry(engine: Engine) -> None:
    allocator = Allocator(engine)
    first = allocator.allocate("weekly", W32, "scheduled:slot-1")
    again = allocator.allocate("weekly", W32, "scheduled:slot-1")
    assert first.created and not again.created
    assert again.episode.episode_id == first.episode.episode_id
    assert counts(engine) == (1, 1)


def test_the_same_key_returns_the_same_episode_from_a_new_process(
    engine: Engine, database_url: str
) -> None:
    first = Allocator(engine).allocate("weekly", W32, "scheduled:slot-1")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "cli.app",
            "allocate",
            "--key",
            "scheduled:slot-1",
            "--week",
            "2026-W32",
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    payload = json.loads(result.stdout)
    assert payload["episode_id"] == str(first.episode.episode_id)
    assert payload["created"] is False
    assert counts(engine) == (1, 1)


def test_a_key_cannot_cross_into_another_week(engine: Engine) -> None:
    allocator = Allocator(engine)
    allocator.allocate("weekly", W32, "k")
    before = counts(engine)
    with pytest.raises(AllocationConflict, match="2026-W32-0"):
        allocator.allocate("weekly", W33, "k")
    assert counts(engine) == before
    assert EpisodeRepository(engine).list("weekly", W33) == []


@pytest.mark.parametrize("backend", [pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_key_owning_several_episodes_fails_closed(engine: Engine) -> None:
    """Data damaged by hand (unique constraint dropped) must stop allocation, not pick one.

    Postgres only: SQLite cannot drop a table-level unique constraint in place.
    """
    allocator = Allocator(engine)
    allocator.allocate("weekly", W32, "a")
    allocator.allocate("weekly", W32, "b")
    with engine.begin() as conn:
        conn.execute(
            text("ALTER TABLE episodes DROP CONSTRAINT uq_episodes_pipeline_allocation_key")
        )
        conn.execute(
            update(EpisodeRow).where(EpisodeRow.allocation_key == "b").values(allocation_key="a")
        )
    before = counts(engine)
    with pytest.raises(AllocationConflict, match="several episodes"):
        allocator.allocate("weekly", W32, "a")
    assert counts(engine) == before


def test_several_completed_episodes_coexist_in_one_week(engine: Engine) -> None:
    allocator = Allocator(engine)
    for key in ("release-a", "release-b"):
        allocator.allocate("weekly", W32, key)
    with engine.begin() as conn:
        conn.execute(update(EpisodeRow).values(state="completed"))
    third = allocator.allocate("weekly", W32, "release-c")
    assert str(third.episode.episode_id) == "2026-W32-2"
    episodes = EpisodeRepository(engine).list("weekly", W32)
    assert [e.state for e in episodes] == ["completed", "completed", "allocated"]
    assert not allocator.allocate("weekly", W32, "release-a").created


def test_pipelines_have_their_own_sequences(engine: Engine) -> None:
    allocator = Allocator(engine)
    assert allocator.allocate("weekly", W32, "k").episode.sequence == 0
    assert allocator.allocate("podcast", W32, "k").episode.sequence == 0
    assert allocator.allocate("podcast", W32, "k2").episode.sequence == 1


def test_allocation_writes_an_allocated_history_event(engine: Engine) -> None:
    allocation = Allocator(engine).allocate("weekly", W32, "k")
    history = EpisodeRepository(engine).history("weekly", allocation.episode.episode_id)
    assert [event.kind for event in history] == ["allocated"]
    assert history[0].detail == {"allocation_key": "k"}
    assert history[0].at.tzinfo is not None


def test_bad_input_is_refused_before_touching_the_database(engine: Engine) -> None:
    allocator = Allocator(engine)
    with pytest.raises(InvalidInput):
        allocator.allocate("Bad Pipeline", W32, "k")
    with pytest.raises(InvalidInput):
        allocator.allocate("weekly", W32, " ")
    assert counts(engine) == (0, 0)


@pytest.mark.parametrize("backend", [pytest.param("postgres", marks=pytest.mark.postgres)])
def test_postgres_lock_is_transaction_scoped(engine: Engine) -> None:
    """No advisory lock outlives the allocation transaction (a session lock would)."""
    Allocator(engine).allocate("weekly", W32, "k")
    with engine.connect() as conn:
        held = conn.execute(  # this database's locks: other tests' run beside it (xdist)
            text(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = "
                "(SELECT oid FROM pg_database WHERE datname = current_database())"
            )
        ).scalar_one()
    assert held == 0
