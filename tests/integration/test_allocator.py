"""The allocator, on SQLite (filelock + BEGIN IMMEDIATE) and Postgres (advisory xact lock)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from sqlalchemy import Engine, func, select, text, update

from episodic.core.errors import AllocationConflict, InvalidInput
from episodic.core.ids import WeekId
from episodic.storage.allocator import Allocator
from episodic.storage.episodes import EpisodeRepository
from episodic.storage.models import EpisodeEventRow, EpisodeRow

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
            "episodic.cli.app",
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


def test_several_assembled_episodes_coexist_in_one_week(engine: Engine) -> None:
    allocator = Allocator(engine)
    for key in ("release-a", "release-b"):
        allocator.allocate("weekly", W32, key)
    with engine.begin() as conn:
        conn.execute(update(EpisodeRow).values(state="assembled"))
    third = allocator.allocate("weekly", W32, "release-c")
    assert str(third.episode.episode_id) == "2026-W32-2"
    episodes = EpisodeRepository(engine).list("weekly", W32)
    assert [e.state for e in episodes] == ["assembled", "assembled", "allocated"]
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


# The slot belongs to the pipeline, whichever deployment carries its schedule.
SLOT = "2026-08-06T07:00:00Z"
OLD_KEY = f"scheduled:weekly-episode/weekly:{SLOT}"  # the older key format
NEW_KEY = f"slot:weekly:{SLOT}"


def test_a_slot_allocated_under_the_old_key_format_keeps_its_episode(engine: Engine) -> None:
    """A Retry after the upgrade asks with the new key and finds the old episode, by
    lookup: nothing is rewritten, nothing new is allocated."""
    before = Allocator(engine).allocate("weekly", W32, OLD_KEY)
    again = Allocator(engine).allocate("weekly", W32, NEW_KEY, scheduled_by="weekly-episode/weekly")
    assert not again.created
    assert again.episode.episode_id == before.episode.episode_id
    assert again.episode.allocation_key == OLD_KEY  # the recorded key stays
    assert again.scheduled_by == ("weekly-episode/weekly",)  # the old key names it
    assert counts(engine) == (1, 1)  # and this deployment was known: no event written
    later = Allocator(engine).allocate("weekly", W32, f"slot:weekly:{'2026-08-03T07:00:00Z'}")
    assert later.created and str(later.episode.episode_id) == "2026-W32-1"


def test_an_old_key_of_another_slot_or_pipeline_is_not_taken(engine: Engine) -> None:
    Allocator(engine).allocate(
        "weekly", W32, "scheduled:weekly-episode/weekly:2026-08-06T07:00:01Z"
    )
    Allocator(engine).allocate("other", W32, OLD_KEY)
    Allocator(engine).allocate("weekly", W32, f"scheduled:weekly/nodeployment%{SLOT}")
    mine = Allocator(engine).allocate("weekly", W32, NEW_KEY)
    assert mine.created and str(mine.episode.episode_id) == "2026-W32-2"


def test_an_old_key_asking_after_the_upgrade_finds_the_slot_episode(engine: Engine) -> None:
    """A run created before the upgrade with an explicit old key (a duplicate of a slot)
    finds the episode the new key allocated."""
    new = Allocator(engine).allocate("weekly", W32, NEW_KEY)
    old = Allocator(engine).allocate("weekly", W32, OLD_KEY)
    assert not old.created and old.episode.episode_id == new.episode.episode_id


def test_a_slot_two_deployments_allocated_before_the_upgrade_is_each_ones_own(
    engine: Engine,
) -> None:
    """The old code gave each deployment its own episode for one slot (set up here as it
    wrote them): each deployment's runs keep their episode; nobody else gets either."""
    for n, deployment in enumerate(["weekly", "weekly-copy"]):
        Allocator(engine).allocate("weekly", W32, f"placeholder-{n}")
        with engine.begin() as conn:
            conn.execute(
                update(EpisodeRow)
                .where(EpisodeRow.allocation_key == f"placeholder-{n}")
                .values(allocation_key=f"scheduled:weekly-episode/{deployment}:{SLOT}")
            )
    # A run of either deployment still finds its own (a Retry of a slot allocated twice
    # under the older format keeps working after the upgrade) ...
    for n, deployment in enumerate(["weekly", "weekly-copy"]):
        for key in (NEW_KEY, f"scheduled:weekly-episode/{deployment}:{SLOT}"):
            own = Allocator(engine).allocate(
                "weekly", W32, key, scheduled_by=f"weekly-episode/{deployment}"
            )
            assert not own.created and str(own.episode.episode_id) == f"2026-W32-{n}"
    # ... and a third asker, or one that names no deployment, is refused.
    for by in ("weekly-episode/weekly-third", None):
        with pytest.raises(AllocationConflict, match="several episodes"):
            Allocator(engine).allocate("weekly", W32, NEW_KEY, scheduled_by=by)
    assert counts(engine) == (2, 2)


def test_a_second_deployment_asking_for_a_slot_is_recorded_once(engine: Engine) -> None:
    allocator = Allocator(engine)
    first = allocator.allocate("weekly", W32, NEW_KEY, scheduled_by="weekly-episode/weekly")
    copy = allocator.allocate("weekly", W32, NEW_KEY, scheduled_by="weekly-episode/weekly-copy")
    retry = allocator.allocate("weekly", W32, NEW_KEY, scheduled_by="weekly-episode/weekly-copy")
    assert first.created and not copy.created and not retry.created
    assert copy.episode.episode_id == first.episode.episode_id == retry.episode.episode_id
    assert copy.scheduled_by == ("weekly-episode/weekly", "weekly-episode/weekly-copy")
    assert retry.scheduled_by == copy.scheduled_by
    with engine.connect() as conn:
        events = conn.execute(
            select(EpisodeEventRow.kind, EpisodeEventRow.detail).order_by(EpisodeEventRow.id)
        ).all()
    assert [(kind, detail.get("scheduled_by")) for kind, detail in events] == [
        ("allocated", "weekly-episode/weekly"),
        ("slot_requested", "weekly-episode/weekly-copy"),
    ]


def test_a_slot_key_of_another_pipeline_is_refused(engine: Engine) -> None:
    with pytest.raises(InvalidInput, match="slot of pipeline weekly"):
        Allocator(engine).allocate("other", W32, NEW_KEY)
    assert counts(engine) == (0, 0)
