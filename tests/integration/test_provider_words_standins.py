"""The provider's words and unknown outcomes against the stand-in of Replicate's API written
from its public documentation (tests/standins): its problem documents, a failed prediction's
``error``, a reply lost after the create, and its one-hour retention. Counted at the
stand-in's side (creates received, predictions made); SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine, select

from episodic.core.exit_codes import ExitCode
from episodic.storage.models import ItemRow, SubmissionRow
from tests.generation import Episode, new_episode, write_playlist
from tests.integration.test_replicate_fal import _episode
from tests.standins import ReplicateStandIn
from tests.standins.replicate import TOKEN


def _replicate(
    engine: Engine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    standin: ReplicateStandIn,
    *,
    lookup_by_input: bool = True,
) -> Episode:
    episode = _episode(
        engine,
        tmp_path,
        monkeypatch,
        "replicate",
        standin.base_url,
        lookup_by_input=lookup_by_input,
    )
    monkeypatch.setenv("IMAGE_KEY", TOKEN)  # the stand-in's own token
    return episode


def _errors(engine: Engine) -> dict[str, str]:
    with engine.connect() as conn:
        rows = conn.execute(select(ItemRow.video_id, ItemRow.error_text)).all()
    return {str(video): str(error) for video, error in rows}


def test_a_cuda_error_and_a_402_reach_the_operator_with_their_steps(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ReplicateStandIn() as standin:
        standin.script("fox", status="failed", error="CUDA out of memory")
        episode = _replicate(engine, tmp_path, monkeypatch, standin)
        episode.plan(write_playlist(tmp_path / "pl", ["fox"], profile="real"))
        failed = episode.generate()
        assert failed.exit_code == ExitCode.RUN_FAILED
        assert "prediction failed: CUDA out of memory" in _errors(engine)["v01"]
        assert "CUDA out of memory" in failed.message
        assert standin.bill_micros == 0  # an official model bills outputs: none
        standin.refuse(1, 402)  # the account ran out of credit
        again = episode.resume(str(failed.run_id))
        assert "create refused: HTTP 402 (Insufficient credit: You have insufficient" in (
            again.message
        ), again.message
        assert "add credit to the account of profile 'real'" in again.message
        assert "resume with:" not in again.message and TOKEN not in again.message
        assert len(standin.create_requests) == 2 and standin.jobs_made_total == 1


def test_a_reply_lost_in_a_second_episode_of_the_same_playlist_finds_its_own_prediction(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ReplicateStandIn() as standin:
        first = _replicate(engine, tmp_path, monkeypatch, standin)
        playlist = write_playlist(tmp_path / "pl", ["fox"], profile="real")
        first.plan(playlist)
        assert first.generate().exit_code == ExitCode.OK
        second = new_episode(engine, "test:2")
        second.plan(playlist)
        standin.lose_reply(1)  # made, then 500
        outcome = second.generate()
        assert outcome.exit_code == ExitCode.OK, outcome.message
        assert len(standin.create_requests) == 2 and standin.jobs_made_total == 2
        with engine.connect() as conn:
            refs = list(conn.execute(select(SubmissionRow.remote_ref)).scalars())
        assert sorted(refs) == sorted(standin.predictions)  # each episode its own


@pytest.mark.slow
def test_a_prediction_is_adopted_within_the_hour_and_refused_once_its_input_is_removed(
    engine: Engine,
    database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Without lookup_by_input a lost reply waits for the operator. Within Replicate's
    retention hour the prediction is verified and adopted (no create) and collected; after
    it, its input reads ``{}`` and it cannot be verified: refused, nothing recorded."""
    from episodic.cli.app import run

    with ReplicateStandIn() as standin:
        episode = _replicate(engine, tmp_path, monkeypatch, standin, lookup_by_input=False)
        episode.plan(write_playlist(tmp_path / "pl", ["fox", "owl"], profile="real"))
        standin.lose_reply(2)
        outcome = episode.generate()
        assert outcome.exit_code == ExitCode.RUN_FAILED
        run_id = str(outcome.run_id)
        fox, owl = (
            next(p for p, made in standin.predictions.items() if animal in str(made.input))
            for animal in ("fox", "owl")
        )
        standin.finish(owl)
        standin.advance(3601)  # the hour passes for the owl's prediction
        capsys.readouterr()
        assert run(["runs", "adopt", run_id, "v02.p1", "--job", owl]) == 2
        assert "no longer shows its input" in capsys.readouterr().err
        assert run(["runs", "adopt", run_id, "v02.p1", "--job", fox]) == 2
        assert "input is not item v02.p1's" in capsys.readouterr().err
        assert run(["runs", "adopt", run_id, "v01.p1", "--job", fox]) == 0
        done = episode.resume(run_id)
        assert done.counts.completed == 1, done.message
        assert len(standin.create_requests) == 2 and standin.jobs_made_total == 2
        assert "owl" not in str(_errors(engine)["v01"])
        assert _errors(engine)["v02"].startswith("acceptance unknown")


@pytest.mark.slow
def test_a_fal_request_whose_reply_was_lost_is_adopted_by_its_echoed_seed_and_prompt(
    engine: Engine,
    database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """fal's queue lists nothing: the operator finds the request in its history. The other
    item's request (recorded) is refused; the right one is verified by the seed and prompt
    its result echoes, adopted (no submit) and collected, billed once by the stand-in."""
    from episodic.cli.app import run
    from tests.standins import FalStandIn
    from tests.standins.fal import TOKEN as FAL_TOKEN

    with FalStandIn() as standin:
        episode = _episode(engine, tmp_path, monkeypatch, "fal", standin.base_url)
        monkeypatch.setenv("IMAGE_KEY", FAL_TOKEN)
        episode.plan(write_playlist(tmp_path / "pl", ["fox", "owl"], profile="real"))
        standin.lose_reply(1)  # the first submit is made, then answered 500
        outcome = episode.generate(concurrency=1)
        assert outcome.exit_code == ExitCode.PARTIAL, outcome.message
        run_id = str(outcome.run_id)
        lost_item = next(v for v, e in _errors(engine).items() if e.startswith("acceptance"))
        label = f"{lost_item}.p1"
        other = "v02.p1" if label == "v01.p1" else "v01.p1"
        ids = {str(r.input.get("seed")): rid for rid, r in standin.fal_requests.items()}
        seed = 101 if label == "v01.p1" else 102
        ours, theirs = ids[str(seed)], ids[str(203 - seed)]
        standin.finish(ours)
        submits = len(standin.create_requests)
        capsys.readouterr()
        assert run(["runs", "adopt", run_id, label, "--job", theirs]) == 2
        assert f"recorded in the ledger for item {other}" in capsys.readouterr().err
        assert run(["runs", "adopt", run_id, label, "--job", ours, "--json"]) == 0
        assert f"seed {seed}" in capsys.readouterr().out
        done = episode.resume(run_id)
        assert done.exit_code == ExitCode.OK, done.message
        assert len(standin.create_requests) == submits == 2 and standin.jobs_made_total == 2
        assert len(standin.bills) == 2  # each request billed once, by the stand-in
