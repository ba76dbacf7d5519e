"""The run engine and the ledger with the fake provider, on SQLite and Postgres."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select, update

from episodic.core.errors import BudgetExceeded, CommandNotAllowed, EpisodeNotFound
from episodic.core.exit_codes import ExitCode
from episodic.core.states import RunState
from episodic.storage.base import utcnow
from episodic.storage.models import CostEntryRow, ItemRow, RunRow, SubmissionRow
from tests.generation import (
    Episode,
    image_keys,
    new_episode,
    provider_log,
    submissions_per_item,
    write_playlist,
)


@pytest.fixture(autouse=True)
def fake_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "provider.jsonl"
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(path))
    return path


@pytest.fixture
def episode(engine: Engine, database_url: str) -> Episode:
    return new_episode(engine)


def count(engine: Engine, table: type) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def test_a_run_completes_and_records_the_ledger(episode: Episode, tmp_path: Path) -> None:
    episode.plan(write_playlist(tmp_path / "p", ["a", "b", "c"], parts={2: [1, 2]}))
    outcome = episode.generate()
    assert outcome.exit_code == ExitCode.OK and outcome.state == RunState.COMPLETED
    assert outcome.counts.completed == 4 and outcome.counts.paid_submissions == 4
    assert outcome.counts.cost_micros == 160_000  # 4 images at 4 cents
    assert sorted(submissions_per_item().values()) == [1, 1, 1, 1]
    with episode.engine.connect() as conn:
        subs = conn.execute(select(SubmissionRow.state, SubmissionRow.remote_ref)).all()
    assert {s.state for s in subs} == {"succeeded"} and all(s.remote_ref for s in subs)
    assert count(episode.engine, CostEntryRow) == 4
    stored = image_keys(episode.engine)  # in the store, verified; no machine path recorded
    assert len(stored) == 4 and {media_type for *_, media_type in stored} == {"image/png"}
    assert not (episode.settings.home_path / "episodes").exists()  # nothing beside the store


def test_an_unchanged_second_run_skips_everything_and_pays_nothing(
    episode: Episode, tmp_path: Path
) -> None:
    episode.plan(write_playlist(tmp_path / "p", ["a", "b"]))
    episode.generate()
    second = episode.generate()
    assert second.exit_code == ExitCode.OK and second.skipped == 2
    assert second.counts.paid_submissions == 0
    assert sum(submissions_per_item().values()) == 2


def test_transient_failures_are_retried_inside_one_attempt(
    episode: Episode, tmp_path: Path
) -> None:
    episode.plan(write_playlist(tmp_path / "p", ["ok [[FAIL_TRANSIENT:2]]"]))
    outcome = episode.generate()
    assert outcome.exit_code == ExitCode.OK
    assert submissions_per_item() == {"v01.p1": 3}  # two transient refusals, then accepted
    with episode.engine.connect() as conn:
        assert conn.execute(select(ItemRow.attempts)).scalar_one() == 1


def test_partial_failure_exits_6_and_resume_retries_until_max_retries(
    episode: Episode, tmp_path: Path
) -> None:
    episode.plan(write_playlist(tmp_path / "p", ["good", "bad [[FAIL_TRANSIENT]]"]))
    first = episode.generate(max_retries=1)
    assert first.exit_code == ExitCode.PARTIAL and first.state == RunState.FAILED
    assert f"episodic runs resume {first.run_id}" in first.message
    second = episode.resume(first.run_id)
    assert second.exit_code == ExitCode.PARTIAL
    third = episode.resume(first.run_id)  # max_retries=1: two attempts were all it gets
    assert third.counts.paid_submissions == 3  # good once, bad twice: no third attempt
    with episode.engine.connect() as conn:
        attempts = dict(conn.execute(select(ItemRow.video_id, ItemRow.attempts)).all())
    assert attempts == {"v01": 1, "v02": 2}
    assert submissions_per_item()["v01.p1"] == 1


def test_every_item_failing_exits_4(episode: Episode, tmp_path: Path) -> None:
    episode.plan(write_playlist(tmp_path / "p", ["x [[FAIL_PERMANENT]]", "y [[FAIL_PERMANENT]]"]))
    outcome = episode.generate()
    assert outcome.exit_code == ExitCode.RUN_FAILED
    assert submissions_per_item() == {"v01.p1": 1, "v02.p1": 1}  # permanent: no in-attempt retry


def test_items_out_of_retries_never_let_generate_say_completed(
    episode: Episode, tmp_path: Path
) -> None:
    """Every paid attempt of one item is used up: a later generate creates no run, says so,
    and exits 6 with the --max-retries to use, never "completed"."""
    episode.plan(write_playlist(tmp_path / "p", ["ok", "bad [[FAIL_PERMANENT]]"]))
    for _ in range(2):
        assert episode.generate(max_retries=1).exit_code == ExitCode.PARTIAL
    outcome = episode.generate(max_retries=1)
    assert outcome.run_id is None and outcome.exit_code == ExitCode.PARTIAL
    assert "out of retries" in outcome.message and "--max-retries 2" in outcome.message
    assert submissions_per_item() == {"v01.p1": 1, "v02.p1": 2}
    more = episode.generate(max_retries=2)  # one more attempt allowed: one more paid call
    assert more.exit_code == ExitCode.PARTIAL and submissions_per_item()["v02.p1"] == 3


def test_lost_response_is_reconciled_by_client_reference_never_resubmitted(
    episode: Episode, tmp_path: Path
) -> None:
    episode.plan(write_playlist(tmp_path / "p", ["lost [[LOSE_RESPONSE]]", "fine"]))
    first = episode.generate()
    assert first.exit_code == ExitCode.OK  # settled at once: the lookup found our job
    assert submissions_per_item() == {"v01.p1": 1, "v02.p1": 1}
    assert any(e["event"] == "lookup" for e in provider_log())
    with episode.engine.connect() as conn:
        assert set(conn.execute(select(SubmissionRow.state)).scalars()) == {"succeeded"}
    assert episode.generate().counts.paid_submissions == 0


def test_unknown_acceptance_waits_for_an_operator_then_force_resubmit_is_recorded(
    episode: Episode, tmp_path: Path
) -> None:
    episode.plan(write_playlist(tmp_path / "p", ["lost [[LOSE_RESPONSE]] [[NO_LOOKUP]]"]))
    first = episode.generate()
    assert first.exit_code == ExitCode.RUN_FAILED
    again = episode.resume(first.run_id)
    assert again.exit_code == ExitCode.RUN_FAILED
    assert jobs_per_item() == {"v01.p1": 1}  # never a new job on its own (same-key resends only)
    with episode.engine.connect() as conn:
        assert "force-resubmit" in conn.execute(select(ItemRow.error_text)).scalar_one()
        assert conn.execute(select(SubmissionRow.state)).scalar_one() == "unknown"
    forced = episode.resume(first.run_id, force_resubmit=True)
    assert jobs_per_item() == {"v01.p1": 2}
    assert forced.exit_code == ExitCode.RUN_FAILED  # the marker loses this reply too
    with episode.engine.connect() as conn:
        rows = conn.execute(
            select(SubmissionRow.attempt, SubmissionRow.forced, SubmissionRow.state).order_by(
                SubmissionRow.id
            )
        ).all()
    assert [(r.attempt, r.forced) for r in rows] == [(1, False), (2, True)]
    assert rows[0].state == "failed"  # abandoned by the operator, in the ledger


def test_an_expired_claim_is_taken_over(episode: Episode, tmp_path: Path) -> None:
    episode.plan(write_playlist(tmp_path / "p", ["a"]))
    first = episode.generate()
    with episode.engine.begin() as conn:  # a crashed worker left it running, lease expired
        conn.execute(
            update(ItemRow).values(
                state="running",
                claim_owner="dead-host:1:x",
                lease_expires_at=utcnow() - timedelta(seconds=1),
                output_path=None,
            )
        )
        conn.execute(update(SubmissionRow).values(state="failed"))
    fresh = episode.generate()
    assert fresh.counts.completed == 1 and fresh.run_id != first.run_id
    assert fresh.counts.paid_submissions == 1
    assert episode.generate().skipped == 1


def test_a_live_claim_is_followed_until_its_lease_expires(episode: Episode, tmp_path: Path) -> None:
    episode.plan(write_playlist(tmp_path / "p", ["a", "b"]))
    first = episode.generate()
    with episode.engine.begin() as conn:  # another worker holds v01 for two more seconds
        conn.execute(
            update(ItemRow)
            .where(ItemRow.video_id == "v01")
            .values(
                state="running",
                claim_owner="other-host:1:x",
                claim_run_id=first.run_id,
                lease_expires_at=utcnow() + timedelta(seconds=2),
                output_path=None,
            )
        )
        conn.execute(update(SubmissionRow).values(state="failed"))
    outcome = episode.generate()
    assert outcome.exit_code == ExitCode.OK and outcome.followed == (first.run_id,)
    assert outcome.counts.paid_submissions == 1  # then took over the abandoned item once
    assert submissions_per_item() == {"v01.p1": 2, "v02.p1": 1}


def test_only_selects_videos(episode: Episode, tmp_path: Path) -> None:
    episode.plan(write_playlist(tmp_path / "p", [f"t{n}" for n in range(1, 11)]))
    outcome = episode.generate(only=frozenset({3, 7, 8, 9}))
    assert outcome.counts.completed == 4
    assert set(submissions_per_item()) == {"v03.p1", "v07.p1", "v08.p1", "v09.p1"}


def test_the_budget_guard_creates_nothing(episode: Episode, tmp_path: Path) -> None:
    episode.plan(write_playlist(tmp_path / "p", ["a", "b", "c"]))
    with pytest.raises(BudgetExceeded, match="3 new paid calls"):
        episode.generate(max_images=2)
    with pytest.raises(BudgetExceeded, match=r"0\.12 USD"):
        episode.generate(max_cost_micros=110_000)
    assert count(episode.engine, RunRow) == 0 and count(episode.engine, ItemRow) == 0
    assert provider_log() == []
    assert episode.generate(max_images=3, max_cost_micros=120_000).exit_code == ExitCode.OK


@pytest.mark.parametrize(
    "change",
    [
        {"template_version": 2},
        {"seeds": [7, 102]},
        {"references": {"style.txt": "new palette"}},
        {"prompt": "another cover for {title} part {part}"},
    ],
)
def test_changing_an_input_regenerates(episode: Episode, tmp_path: Path, change: dict) -> None:
    base = {"references": {"style.txt": "palette"}}
    episode.plan(write_playlist(tmp_path / "a", ["a", "b"], **base))
    episode.generate()
    episode.plan(write_playlist(tmp_path / "b", ["a", "b"], **{**base, **change}))
    again = episode.generate()
    expected = 1 if "seeds" in change else 2  # only the video whose seed changed
    assert again.counts.paid_submissions == expected


def test_generate_needs_a_plan_and_an_existing_episode(engine: Engine, database_url: str) -> None:
    episode = new_episode(engine)
    with pytest.raises(CommandNotAllowed, match="no plan"):
        episode.generate()
    with pytest.raises(EpisodeNotFound):
        Episode(engine, "2026-W32-5").generate()
    assert provider_log() == []


def test_a_stop_before_the_call_withdraws_the_intent(episode: Episode, tmp_path: Path) -> None:
    """Claimed, intended, then stopped before sending: no unknown is left behind."""
    from episodic.core.planning import RunOptions
    from episodic.pipeline.check import check_episodes
    from episodic.pipeline.gate import EnvironmentCredentials
    from episodic.pipeline.generation import build_runner, prepare
    from tests.generation import new_run

    episode.plan(write_playlist(tmp_path / "p", ["a", "b", "c"]))

    def claims_then_dies(items, job, concurrency, stop, progress):  # a task that never ran
        for item in items:
            job.claim(item)
        raise RuntimeError("no provider slot")

    prepared = prepare(episode.engine, episode.settings, "weekly", episode.episode_id, "generate")
    options = RunOptions()
    run_id = new_run(episode, options)
    engine = build_runner(
        episode.engine,
        episode.settings,
        prepared,
        EnvironmentCredentials(),
        executor=claims_then_dies,
    )
    with pytest.raises(RuntimeError, match="no provider slot"):
        engine.execute(run_id, options)
    assert count(episode.engine, SubmissionRow) == 0 and provider_log_jobs() == 0
    with episode.engine.connect() as conn:
        assert set(conn.execute(select(ItemRow.attempts)).scalars()) == {0}
    assert check_episodes(episode.engine, "weekly") == []
    again = episode.generate()
    assert again.exit_code == ExitCode.OK and again.counts.paid_submissions == 3
    assert submissions_per_item() == {"v01.p1": 1, "v02.p1": 1, "v03.p1": 1}


def provider_log_jobs() -> int:
    return sum(1 for e in provider_log() if e["event"] == "job_created")


def jobs_per_item() -> dict[str, int]:
    from collections import Counter

    return dict(Counter(e["item_id"] for e in provider_log() if e["event"] == "job_created"))
