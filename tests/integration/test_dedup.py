"""Dedup at the door: one choke point decides, under concurrency, on both backends.

An automation loop may send one job twenty times: twenty rows must not be born.
Here separate OS processes, released together by a barrier, send the same request; exactly
one run may come to exist and every other answer must say ``deduplicated``. Money is
counted from the fake provider's own log.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select, update

from episodic.core.errors import IdempotencyKeyReused, ProviderConfigError
from episodic.core.planning import RunOptions
from episodic.pipeline.check import check_episodes
from episodic.storage.models import RunRow
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
    """An automation loop's burst: 20 processes, one request, one run, 19 deduplicated."""
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
    # The run lasts over a second and a half, so every process, however starved of CPU on a
    # loaded machine, asks while it is still active (a request after it completed starts a
    # new run, which pays nothing: seen under load with 150 ms items).
    monkeypatch.setenv("EPISODIC_FAKE_DELAY_MS", "1500")
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

    from episodic.storage.base import utcnow

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
    """No ghost rows: twenty refused requests (credential missing) leave no run."""
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


# ---------------------------------------------------------------- recovery
def _retry(episode: Episode) -> object:
    from episodic.pipeline.gate import EnvironmentCredentials
    from episodic.pipeline.generation import retry

    return retry(
        episode.engine, episode.settings, "weekly", episode.episode_id, EnvironmentCredentials()
    )


def _episode_state(episode: Episode) -> str:
    from episodic.storage.models import EpisodeRow

    with episode.engine.connect() as conn:
        return str(conn.execute(select(EpisodeRow.state)).scalar_one())


def test_a_crash_between_completion_and_generated_is_reported_and_retry_repairs_it(
    episode: Episode,
) -> None:
    from episodic.storage.models import EpisodeRow

    assert episode.generate().state.value == "completed"
    with episode.engine.begin() as conn:  # the process died right before marking it
        conn.execute(update(EpisodeRow).values(state="allocated"))
    findings = check_episodes(episode.engine, "weekly")
    assert [f.check for f in findings] == ["state"] and "retry" in findings[0].detail
    outcome = _retry(episode)
    assert outcome.exit_code == 0  # type: ignore[attr-defined]
    assert _episode_state(episode) == "generated"
    assert check_episodes(episode.engine, "weekly") == []


def test_a_run_left_pending_by_a_crash_is_finished_by_retry_and_resume(
    episode: Episode,
) -> None:
    older = new_run(episode)  # two processes died before starting their runs
    ghost = new_run(episode)
    outcome = _retry(episode)  # the latest run
    assert outcome.run_id == ghost and outcome.state.value == "completed"  # type: ignore[attr-defined]
    assert episode.resume(older).state.value == "completed"  # nothing left, still resumable
    assert set(jobs_per_key().values()) == {1}


def test_an_interrupt_before_the_run_starts_leaves_no_pending_row(episode: Episode) -> None:
    from episodic.core.planning import RunOptions
    from episodic.pipeline.gate import EnvironmentCredentials
    from episodic.pipeline.generation import generate

    def interrupted(engine: object, run_id: str) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        generate(
            episode.engine,
            episode.settings,
            "weekly",
            episode.episode_id,
            RunOptions(),
            EnvironmentCredentials(),
            on_start=interrupted,
        )
    with episode.engine.connect() as conn:
        assert [r[0] for r in conn.execute(select(RunRow.state))] == ["cancelled"]
    assert jobs_per_key() == {}  # nothing was sent
    assert episode.generate().state.value == "completed"


def test_the_same_request_after_a_pause_continues_the_paused_run(episode: Episode) -> None:
    from episodic.core.states import RunState
    from episodic.storage.runs import RunStore

    paused = admit(episode.engine, episode.episode_id).run_id
    assert paused is not None
    store = RunStore(episode.engine)
    store.transition_run(paused, RunState.RUNNING, lease_s=30)
    store.transition_run(paused, RunState.PAUSED, "interrupted")  # Ctrl-C or SIGTERM
    outcome = episode.generate()
    assert outcome.run_id == paused and outcome.state.value == "completed"
    assert _runs(episode.engine) == 1


def test_retry_of_a_cancelled_run_asks_again_and_pays_once(episode: Episode) -> None:
    from episodic.core.states import RunState
    from episodic.storage.runs import RunStore

    cancelled = new_run(episode)
    RunStore(episode.engine).transition_run(cancelled, RunState.CANCELLED, "by operator")
    outcome = _retry(episode)
    assert outcome.run_id != cancelled and outcome.state.value == "completed"  # type: ignore[attr-defined]
    assert set(jobs_per_key().values()) == {1} and len(jobs_per_key()) == 4


def test_an_explicit_key_cannot_be_combined_with_an_opt_out(episode: Episode) -> None:
    from episodic.core.errors import InvalidInput

    for extra in ({"batch_id": "b"}, {"allow_duplicate": True}):
        with pytest.raises(InvalidInput, match="names one request"):
            admit(episode.engine, episode.episode_id, idempotency_key="k", **extra)
    assert _runs(episode.engine) == 0
