"""Dedup at the door (DESIGN 6): one choke point decides, under concurrency, on both backends.

The seed incident: an automation loop sent one job twenty times and twenty rows were born.
Here separate OS processes, released together by a barrier, send the same request; exactly
one run may come to exist and every other answer must say ``deduplicated``. Money is
counted from the fake provider's own log.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select, update

from core.errors import IdempotencyKeyReused, ProviderConfigError
from pipeline.check import check_episodes
from pipeline.runs import RunOptions
from storage.models import RunRow
from tests.generation import (
    Episode,
    admit,
    jobs_per_key,
    new_episode,
    new_run,
    provider_log,
    write_playlist,
)
from tests.integration import race_workers as w

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def fake_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "provider.jsonl"
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(path))
    return path


@pytest.fixture
def episode(engine: Engine, tmp_path: Path) -> Episode:
    ep = new_episode(engine)
    ep.plan(write_playlist(tmp_path / "pl", ["a", "b", "c", "d"]))
    return ep


def _runs(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(RunRow)).scalar_one())


def _admit_race(
    episode: Episode, database_url: str, home: Path, processes: int, threads: int
) -> list[list[object]]:
    answers = w.run_processes(
        [
            (w.admit_worker, (database_url, str(home), episode.episode_id, threads, {}))
            for _ in range(processes)
        ],
        timeout=600,
    )
    return [row for answer in answers for row in answer]


def test_twenty_concurrent_dispatches_create_one_run(
    episode: Episode, database_url: str, tmp_path: Path
) -> None:
    """The seed incident: 20 processes, one request, one run, 19 deduplicated."""
    for trial in range(3):
        rows = _admit_race(episode, database_url, tmp_path / "home", 20, 1)
        assert not [r for r in rows if str(r[1]).startswith("error")], rows
        run_ids = {r[0] for r in rows}
        assert len(run_ids) == 1, rows
        assert sorted(bool(r[1]) for r in rows) == [False] + [True] * 19
        assert _runs(episode.engine) == trial + 1
        # the next trial: this run is no longer active (cancelled), so one new run is made
        with episode.engine.begin() as conn:
            conn.execute(update(RunRow).values(state="cancelled"))


@pytest.mark.parametrize(
    "backend", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
def test_two_hundred_concurrent_dispatches_on_postgres(
    episode: Episode, database_url: str, tmp_path: Path
) -> None:
    """200 callers (40 OS processes, 5 threads each) under READ COMMITTED: still one run."""
    rows = _admit_race(episode, database_url, tmp_path / "home", 40, 5)
    assert len(rows) == 200
    assert not [r for r in rows if str(r[1]).startswith("error")], rows[:3]
    assert len({r[0] for r in rows}) == 1
    assert sum(1 for r in rows if r[1] is False) == 1
    assert _runs(episode.engine) == 1


def test_concurrent_whole_generates_share_one_run_and_pay_once(
    episode: Episode, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight processes run the whole `generate` at once: one run, each item paid once."""
    monkeypatch.setenv("EPISODIC_FAKE_DELAY_MS", "150")
    answers = w.run_processes(
        [(w.generate_with, (database_url, [episode.episode_id], {})) for _ in range(8)]
    )
    rows = [row for answer in answers for row in answer]
    assert not [r for r in rows if str(r[1]).startswith("error")], rows
    assert {r[1] for r in rows} == {"completed"}, rows
    assert _runs(episode.engine) == 1
    assert sum(1 for r in rows if r[4]) == 7  # every other caller joined the one run
    assert set(jobs_per_key().values()) == {1} and len(jobs_per_key()) == 4
    assert check_episodes(episode.engine, "weekly") == []


@pytest.mark.parametrize(
    "dedup",
    [{"allow_duplicate": True}, {"batch_id": "B"}],
    ids=["allow-duplicate", "batch-id"],
)
def test_opting_out_makes_parallel_runs_that_still_pay_each_item_once(
    episode: Episode, database_url: str, monkeypatch: pytest.MonkeyPatch, dedup: dict[str, object]
) -> None:
    monkeypatch.setenv("EPISODIC_FAKE_DELAY_MS", "300")
    targets = []
    for n in range(4):
        options = dict(dedup)
        if "batch_id" in options:
            options["batch_id"] = f"batch-{n}"
        targets.append((w.generate_with, (database_url, [episode.episode_id], options)))
    rows = [row for answer in w.run_processes(targets) for row in answer]
    assert not [r for r in rows if str(r[1]).startswith("error")], rows
    assert {r[1] for r in rows} == {"completed"}, rows
    assert not any(r[4] for r in rows)  # nobody deduplicated
    assert _runs(episode.engine) == 4
    assert set(jobs_per_key().values()) == {1} and len(jobs_per_key()) == 4


def test_the_same_batch_id_dedups(episode: Episode) -> None:
    first = new_run_with(episode, batch_id="nightly-7")
    again = new_run_with(episode, batch_id="nightly-7")
    other = new_run_with(episode, batch_id="nightly-8")
    assert again == (first[0], True)
    assert other[0] != first[0] and other[1] is False


def new_run_with(episode: Episode, **dedup: object) -> tuple[str | None, bool]:
    got = admit(episode.engine, episode.episode_id, **dedup)
    return got.run_id, got.deduplicated


def test_an_explicit_key_with_other_parameters_is_refused(episode: Episode) -> None:
    first = new_run_with(episode, idempotency_key="cron-2026-08-03")
    assert first[1] is False
    assert new_run_with(episode, idempotency_key="cron-2026-08-03") == (first[0], True)
    with pytest.raises(IdempotencyKeyReused) as refused:  # other parameters, same key
        admit(
            episode.engine,
            episode.episode_id,
            RunOptions(max_retries=5),
            idempotency_key="cron-2026-08-03",
        )
    assert first[0] in str(refused.value)
    assert refused.value.exit_code == 2
    assert _runs(episode.engine) == 1


def test_after_the_window_a_new_run_is_created(
    episode: Episode, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EPISODIC_DEDUP_WINDOW_S", "1")
    first = new_run_with(episode)
    assert new_run_with(episode) == (first[0], True)  # inside the window
    time.sleep(1.2)
    later = new_run_with(episode)
    assert later[0] != first[0] and later[1] is False
    monkeypatch.setenv("EPISODIC_DEDUP_WINDOW_S", "0")  # 0: no dedup at all
    assert new_run_with(episode)[1] is False


def test_a_dead_run_of_the_same_request_is_taken_over_not_left_stuck(
    episode: Episode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A running run whose lease expired is not active (not "deduplicated"), but it is the
    same request: it is continued, not left running beside a new run; each item paid once."""
    from datetime import timedelta

    from storage.base import utcnow

    dead = new_run(episode)
    with episode.engine.begin() as conn:
        conn.execute(
            update(RunRow)
            .where(RunRow.id == dead)
            .values(state="running", lease_expires_at=utcnow() - timedelta(seconds=5))
        )
    outcome = episode.generate()
    assert outcome.run_id == dead and not outcome.deduplicated
    assert outcome.state.value == "completed"
    assert _runs(episode.engine) == 1
    assert set(jobs_per_key().values()) == {1} and len(jobs_per_key()) == 4


def test_a_refused_request_writes_nothing(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The seed's ghost rows: twenty refused requests (credential missing) leave no run."""
    profiles = tmp_path / "providers.yaml"
    profiles.write_text(
        "profiles:\n  paid:\n    kind: http\n    base_url: http://127.0.0.1:9/v1\n"
        "    credential_env: PAID_TOKEN\n    cost_per_image_minor: 4\n"
    )
    monkeypatch.setenv("EPISODIC_PROVIDERS_FILE", str(profiles))
    monkeypatch.delenv("PAID_TOKEN", raising=False)
    ep = new_episode(engine)
    ep.plan(write_playlist(tmp_path / "pl", ["a", "b"], profile="paid"))
    for _ in range(20):
        with pytest.raises(ProviderConfigError, match=r"\$PAID_TOKEN is not set"):
            ep.generate()
    assert _runs(engine) == 0
    assert provider_log() == []


def test_nothing_to_do_creates_no_run(episode: Episode) -> None:
    done = episode.generate()
    assert done.state.value == "completed" and done.run_id is not None
    again = episode.generate()
    assert again.run_id is None and again.exit_code == 0 and again.skipped == 4
    assert "nothing to do" in again.message
    assert _runs(episode.engine) == 1
