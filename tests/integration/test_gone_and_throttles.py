"""Outputs the provider deleted, and throttles, against the Replicate- and fal-shaped servers
(tests/jobs_servers.py): counted at the provider's side (jobs made, its bill, the time of
each create request), on SQLite and PostgreSQL.

- An accepted job whose output the provider deleted after its retention (Replicate's
  ``data_removed``, fal's result gone, or a delivery answered 404 again after a fresh poll)
  ends its collect at once, is recorded lost with the charge it was paid, and the item, the
  run's `check` and `runs show` name what it cost and the command that buys it again.
- A create answered 429 with ``Retry-After`` is sent again only after that wait, shared by
  every worker of the profile through the claims; a throttle past the bound pauses the run,
  nothing paid, and a resume later completes it with one job per item.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine, select, text

from episodic.core.exit_codes import ExitCode
from episodic.core.ids import WeekId
from episodic.core.states import RunState
from episodic.pipeline.allocation import allocate
from episodic.pipeline.check import check_episodes
from episodic.providers.jobs_api import retry_after
from episodic.storage.base import utcnow
from episodic.storage.claims import ClaimStore
from episodic.storage.models import ItemRow, SubmissionRow
from episodic.storage.runs import RunStore
from episodic.storage.throttles import ThrottleStore
from tests.generation import Episode, new_episode, write_playlist
from tests.integration import budget_workers as bw
from tests.integration import race_workers as w
from tests.jobs_servers import TOKEN, FalServer, ReplicateServer

PRICE = "0.03 USD"  # cost_per_image_minor: 3


def _profiles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, base_url: str) -> None:
    model = "black-forest-labs/flux-schnell" if kind == "replicate" else "fal-ai/flux/dev"
    (tmp_path / "providers.yaml").write_text(
        "profiles:\n"
        "  real:\n"
        f"    kind: {kind}\n"
        f"    model: {model}\n"
        f"    base_url: {base_url}\n"
        "    credential_env: IMAGE_KEY\n"
        "    cost_per_image_minor: 3\n"
        "    max_concurrency: 8\n"
        "    timeout_s: 2.0\n"
        "    poll_interval_s: 0.02\n"
    )
    monkeypatch.setenv("EPISODIC_PROVIDERS_FILE", str(tmp_path / "providers.yaml"))
    monkeypatch.setenv("IMAGE_KEY", TOKEN)


def _error_of(engine: Engine) -> str:
    with engine.connect() as conn:
        (error,) = conn.execute(select(ItemRow.error_text)).one()
    return str(error)


def _ledger(engine: Engine) -> list[tuple[str, int | None, bool]]:
    """(state, cost, output recorded lost) of each submission, oldest first."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT s.state, c.amount_micros, l.id IS NOT NULL FROM submissions s "
                "LEFT JOIN cost_entries c ON c.submission_pk = s.id "
                "LEFT JOIN lost_outputs l ON l.submission_pk = s.id ORDER BY s.id"
            )
        ).all()
    return [(row[0], row[1], bool(row[2])) for row in rows]


_NOW = datetime(2026, 12, 5, 9, 0, 0, tzinfo=UTC)


# ------------------------------------------------------------------ outputs that are gone
@pytest.mark.parametrize(
    ("kind", "removal"),
    [
        ("replicate", "data_removed"),
        ("replicate", "delivery"),
        ("fal", "data_removed"),
        ("fal", "delivery"),
    ],
)
def test_an_output_deleted_at_the_provider_is_recorded_lost_at_once_and_bought_again(
    engine: Engine,
    database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
    removal: str,
) -> None:
    """A job accepted and left uncollected (the first run's collect timed out) whose output
    the provider then deleted (an hour on its stand-in clock): the next run ends its collect
    at once, with no new job, instead of polling until its 60 s collect timeout; its paid
    call closes failed with its charge and the output is recorded lost; the item, and
    `check`, say what it cost and `media restore --buy-again`, never "at no cost"; that
    command buys it again: two jobs, two bills, the item completed."""
    from episodic.cli.app import run

    server_type = ReplicateServer if kind == "replicate" else FalServer
    with server_type(processing_polls=10**6) as server:
        server.retention_s, server.removal = 3600, removal
        _profiles(tmp_path, monkeypatch, kind, server.base_url)  # type: ignore[attr-defined]
        episode = new_episode(engine)
        episode.plan(write_playlist(tmp_path / "pl", ["owl"], profile="real"))
        first = episode.generate(collect_timeout_s=0.3)
        assert first.counts.completed == 0 and sum(server.jobs_made.values()) == 1
        server.processing_polls = 0  # the job finishes; then its output is deleted
        server.pass_time(3600)
        downloads = len(server.files.requests)
        second = episode.generate(collect_timeout_s=60.0)
        assert second.exit_code != ExitCode.OK and second.counts.paid_submissions == 0
        assert sum(server.jobs_made.values()) == 1  # nothing bought by the collect
        assert server.bill_micros == 3_000
        gets = len(server.files.requests) - downloads
        assert gets == (2 if removal == "delivery" else 0), server.files.requests
        assert _ledger(engine) == [("failed", 30_000, True)]
        error = _error_of(engine)
        assert "output lost at the provider" in error and PRICE in error, error
        command = f"episodic media restore {episode.episode_id} --pipeline weekly --buy-again"
        assert command in error and "at no cost" not in error, error
        said = second.message  # the run's closing line
        assert f"1 paid output deleted at the provider before it was collected ({PRICE})" in said
        assert f"`{command}` buys it again" in said and "at no cost" not in said, said
        findings = check_episodes(engine, "weekly")
        lost = [f.detail for f in findings if f.check == "lost-output"]
        assert len(lost) == 1 and PRICE in lost[0] and command in lost[0], findings
        assert not any("at no cost" in f.detail for f in findings), findings
        assert (
            run(
                [
                    "media",
                    "restore",
                    episode.episode_id,
                    "--pipeline",
                    "weekly",
                    "--buy-again",
                    "--yes",
                ]
            )
            == 0
        )
        assert sum(server.jobs_made.values()) == 2 and server.bill_micros == 6_000
        assert [row[0] for row in _ledger(engine)] == ["failed", "succeeded"]
        assert not [f for f in check_episodes(engine, "weekly") if f.check == "lost-output"]


def test_runs_show_of_a_paused_run_says_until_when_its_accepted_jobs_are_collectable(
    engine: Engine,
    database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A paused run whose prediction Replicate keeps one hour: `runs show` names the job,
    the hour and the moment it stops being collectable, and the resume to run before it."""
    from episodic.cli.app import run

    with ReplicateServer(processing_polls=10**6) as server:
        _profiles(tmp_path, monkeypatch, "replicate", server.base_url)  # type: ignore[attr-defined]
        episode = new_episode(engine)
        episode.plan(write_playlist(tmp_path / "pl", ["owl"], profile="real"))
        first = episode.generate(collect_timeout_s=0.3)
        assert first.run_id is not None
        store = RunStore(engine)
        store.transition_run(first.run_id, RunState.RUNNING, lease_s=60)
        store.transition_run(first.run_id, RunState.PAUSED, "interrupted")
        with engine.connect() as conn:
            ref, accepted = conn.execute(
                select(SubmissionRow.remote_ref, SubmissionRow.accepted_at)
            ).one()
        capsys.readouterr()
        assert run(["runs", "show", first.run_id]) == 0
        out = capsys.readouterr().out
        until = f"{accepted + timedelta(hours=1):%Y-%m-%d %H:%M}"
        assert f"accepted job {ref} (real): its replicate output is kept 60 min" in out, out
        assert f"collectable until about {until}" in out, out
        assert f"`episodic runs resume {first.run_id}`" in out, out


# ------------------------------------------------------------------ throttles
def test_retry_after_is_parsed_strictly() -> None:
    def parsed(*values: str) -> float | None:
        headers = [("Retry-After", v) for v in values]
        return retry_after(httpx.Response(429, headers=headers), now=_NOW)

    assert parsed("1") == 1.0 and parsed("120") == 120.0
    assert parsed("Sat, 05 Dec 2026 09:00:30 GMT") == 30.0
    assert parsed("Sat, 05 Dec 2026 08:00:00 GMT") == 0.0  # already past
    other_formats = ("Saturday, 05-Dec-26 09:00:30 GMT", "Sat Dec  5 09:00:30 2026")
    for bad in ("-1", "1.5", "soon", "", "Sat, 31 Feb 2026 09:00:00 GMT", *other_formats):
        assert parsed(bad) is None, bad
    assert parsed("1", "2") is None and parsed() is None


def test_four_throttled_creates_wait_their_retry_after_and_each_item_is_one_job(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replicate answers every create 429 for two seconds ("Request was throttled. Expected
    available in 2 seconds.", Retry-After: 2): four items at concurrency 4 are not failed
    after four quick tries; no create is sent again before the wait the provider gave, and
    the run completes with one job per item."""
    with ReplicateServer() as server:
        server.throttle_window_s = 2.0
        _profiles(tmp_path, monkeypatch, "replicate", server.base_url)  # type: ignore[attr-defined]
        episode = new_episode(engine)
        episode.plan(write_playlist(tmp_path / "pl", ["a", "b", "c", "d"], profile="real"))
        outcome = episode.generate(concurrency=4)
        assert outcome.exit_code == ExitCode.OK, outcome.message
        assert sorted(server.jobs_made.values()) == [1, 1, 1, 1]
        throttled = [t for t, status in server.create_log if status == 429]
        made = [t for t, status in server.create_log if status == 201]
        assert 1 <= len(throttled) <= 4 and len(made) == 4, server.create_log
        # the first 429 said 2 s: nothing was made before that wait was over
        assert min(made) - min(throttled) >= 1.9, server.create_log
        assert ThrottleStore(engine).held_until("real") is None  # the moment has passed


def test_a_throttle_longer_than_the_bound_pauses_the_run_and_a_resume_completes_it(
    engine: Engine,
    database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Retry-After: 3600 is more than one wait is bound to (60 s): the run pauses at once,
    nothing made nor paid, no item's attempt used, and its line quotes the provider and
    says when and how to resume; a resume inside the hour pauses again without a create,
    one after it completes the run, one job per item."""
    with ReplicateServer() as server:
        server.throttle_creates, server.retry_after = 1, "3600"
        _profiles(tmp_path, monkeypatch, "replicate", server.base_url)  # type: ignore[attr-defined]
        episode = new_episode(engine)
        episode.plan(write_playlist(tmp_path / "pl", ["a", "b", "c"], profile="real"))
        outcome = episode.generate(concurrency=1)
        assert outcome.state == RunState.PAUSED and outcome.exit_code == ExitCode.INTERRUPTED
        assert outcome.run_id is not None
        message = outcome.message
        assert "Request was throttled. Expected available in 3600 seconds." in message, message
        assert "longer than the 60s one wait is bound to" in message, message
        assert f"resume then with: episodic runs resume {outcome.run_id}" in message, message
        assert sum(server.jobs_made.values()) == 0 and server.bill_micros == 0
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM submissions")).scalar_one() == 0
            assert conn.execute(text("SELECT max(attempts) FROM items")).scalar_one() == 0
        early = episode.resume(outcome.run_id)  # inside the hour asked for: paused again
        assert early.exit_code == ExitCode.INTERRUPTED, early.message
        assert [r.method for r in server.requests].count("POST") == 1  # the first create only
        with engine.begin() as conn:  # the hour is over
            conn.execute(
                text("UPDATE provider_throttles SET not_before = :t"),
                {"t": utcnow() - timedelta(seconds=1)},
            )
        done = episode.resume(outcome.run_id)
        assert done.exit_code == ExitCode.OK, done.message
        assert sorted(server.jobs_made.values()) == [1, 1, 1]
        assert server.bill_micros == 9_000


def test_a_throttled_poll_waits_its_retry_after_within_the_collect(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Polls answered 429 with Retry-After: 1 are asked again only after it, and the job is
    collected (one job, completed)."""
    with ReplicateServer() as server:
        server.throttle_polls = 2
        _profiles(tmp_path, monkeypatch, "replicate", server.base_url)  # type: ignore[attr-defined]
        episode = new_episode(engine)
        episode.plan(write_playlist(tmp_path / "pl", ["a"], profile="real"))
        outcome = episode.generate(collect_timeout_s=30.0)
        assert outcome.exit_code == ExitCode.OK, outcome.message
        assert sum(server.jobs_made.values()) == 1
        polls = [r for r in server.requests if r.method == "GET"]
        assert len(polls) >= 3  # two throttled, then answered


def test_a_throttle_one_worker_heard_holds_every_claim_of_the_profile(
    engine: Engine, database_url: str, tmp_path: Path
) -> None:
    """The moment the provider gave is recorded for the profile: another process's claim of
    a new paid call of that profile is refused throttled until then (a later moment is kept
    over an earlier one); another profile, and a moment past, hold nothing."""
    from episodic.core.records import RefusalReason
    from episodic.core.runs import Refusal
    from tests.generation import new_run

    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "pl", ["a"]))
    run_id = new_run(episode)
    RunStore(engine).transition_run(run_id, RunState.RUNNING, lease_s=60)
    with engine.connect() as conn:
        (item_pk,) = conn.execute(select(ItemRow.id)).one()
    throttles = ThrottleStore(engine)
    later = utcnow() + timedelta(seconds=600)
    assert throttles.hold("fake", later, "throttled") == later
    assert throttles.hold("fake", utcnow() + timedelta(seconds=5), "sooner") == later
    claims = ClaimStore(engine)
    refused = claims.claim(item_pk, run_id, "w2", lease_s=60, max_attempts=3, profile="fake")
    assert isinstance(refused, Refusal) and refused.reason == RefusalReason.THROTTLED
    other = claims.claim(item_pk, run_id, "w2", lease_s=60, max_attempts=3, profile="other")
    assert not isinstance(other, Refusal)


def test_two_processes_on_one_profile_share_its_throttle_and_complete(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two real `episodic generate` processes (concurrency 2 each, released together) on two
    episodes of one Replicate profile while it answers 429 for two seconds: each worker is
    told at most once (the throttle one heard holds the others' claims), nothing is made
    before the provider's moment, and both runs complete, one job per item."""
    with ReplicateServer() as server:
        server.throttle_window_s = 2.0
        _profiles(tmp_path, monkeypatch, "replicate", server.base_url)  # type: ignore[attr-defined]
        episodes = []
        for n in range(2):
            allocation = allocate(engine, "weekly", WeekId.parse("2026-W32"), f"share-{n}")
            episode = Episode(engine, str(allocation.episode.episode_id))
            episode.plan(
                write_playlist(tmp_path / f"pl{n}", [f"e{n}i{i}" for i in range(3)], profile="real")
            )
            episodes.append(episode.episode_id)
        env = {
            "EPISODIC_HOME": os.environ["EPISODIC_HOME"],
            "EPISODIC_PROVIDERS_FILE": str(tmp_path / "providers.yaml"),
            "IMAGE_KEY": TOKEN,
        }
        results = w.run_processes(
            [
                (bw.cli_worker, (["generate", e, "--concurrency", "2", "--json"], env))
                for e in episodes
            ]
        )
        for _args, code, out, err in results:
            assert code == 0, (code, out, err)
            assert json.loads(out)["completed"] == 3, out
        assert sorted(server.jobs_made.values()) == [1] * 6
        throttled = [t for t, status in server.create_log if status == 429]
        made = [t for t, status in server.create_log if status == 201]
        assert 1 <= len(throttled) <= 4, server.create_log  # four workers, each told once
        assert min(made) - min(throttled) >= 1.9, server.create_log


@pytest.mark.parametrize("way", ["runs resume", "retry", "generate", "resume --force-resubmit"])
def test_an_output_gone_at_the_provider_is_bought_again_only_by_buy_again(
    engine: Engine,
    database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    way: str,
) -> None:
    """A paid output the provider deleted is paid for: buying it again is a decision to pay
    twice, taken only by `media restore --buy-again` (which quotes it and asks). The run that
    found it gone names that command and no resume; a resume of that run, a retry, a new
    generate of the episode and a forced resubmit each make no job, exit non-zero and name
    the command; then the command makes exactly one more job."""
    from episodic.cli.app import run

    with ReplicateServer(processing_polls=10**6) as server:
        server.retention_s, server.removal = 3600, "data_removed"
        _profiles(tmp_path, monkeypatch, "replicate", server.base_url)
        episode = new_episode(engine)
        episode.plan(write_playlist(tmp_path / "pl", ["owl"], profile="real"))
        first = episode.generate(collect_timeout_s=0.3)
        assert first.counts.completed == 0 and sum(server.jobs_made.values()) == 1
        server.processing_polls = 0
        server.pass_time(3600)
        second = episode.generate(collect_timeout_s=60.0)
        assert second.run_id is not None
        command = f"episodic media restore {episode.episode_id} --pipeline weekly --buy-again"
        assert command in second.message and "resume with" not in second.message, second
        capsys.readouterr()
        argv = {
            "runs resume": ["runs", "resume", second.run_id],
            "retry": ["retry", episode.episode_id],
            "generate": ["generate", episode.episode_id],
            "resume --force-resubmit": ["runs", "resume", second.run_id, "--force-resubmit"],
        }[way]
        code = run(argv)
        said = capsys.readouterr()
        assert code not in (0, 2), (code, said)
        assert sum(server.jobs_made.values()) == 1 and server.bill_micros == 3_000, said
        assert command in said.out + said.err and "resume with" not in said.out + said.err
        assert [row[0] for row in _ledger(engine)] == ["failed"]
        assert (
            run(
                [
                    "media",
                    "restore",
                    episode.episode_id,
                    "--pipeline",
                    "weekly",
                    "--buy-again",
                    "--yes",
                ]
            )
            == 0
        )
        assert sum(server.jobs_made.values()) == 2 and server.bill_micros == 6_000


# ------------------------------------------------------------------ against the stand-ins
def _standin_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, base_url: str) -> None:
    from tests.standins import replicate as replicate_standin

    (tmp_path / "providers.yaml").write_text(
        f"profiles:\n  real:\n    kind: replicate\n    base_url: {base_url}\n"
        "    credential_env: IMAGE_KEY\n    timeout_s: 5.0\n    poll_interval_s: 0.02\n"
        f"    model: {replicate_standin.OFFICIAL_MODEL}\n"
        '    price: {per_image: "0.003"}\n    inputs: {num_outputs: 1}\n'
    )
    monkeypatch.setenv("EPISODIC_PROVIDERS_FILE", str(tmp_path / "providers.yaml"))
    monkeypatch.setenv("IMAGE_KEY", replicate_standin.TOKEN)


def test_a_prediction_removed_after_the_retention_hour_is_lost_once_and_bought_again(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Against the Replicate stand-in: a prediction left running by a first run, finished,
    then past its retention hour (``data_removed: true``): the next run closes it at its
    per-output price without a new prediction, and `media restore --buy-again` makes exactly
    one more; the ledger equals the stand-in's bill."""
    from sqlalchemy import func

    from episodic.storage.models import CostEntryRow
    from tests.standins import ReplicateStandIn

    with ReplicateStandIn() as replicate:
        first_only = {"held": True}  # the first prediction runs until the test ends it
        replicate.script(lambda _input: first_only.pop("held", False), polls=None)
        _standin_profile(tmp_path, monkeypatch, replicate.base_url)
        episode = new_episode(engine)
        episode.plan(write_playlist(tmp_path / "pl", ["owl"], profile="real"))
        assert episode.generate(collect_timeout_s=0.3).counts.completed == 0
        (made,) = replicate.predictions
        replicate.finish(made, "succeeded")
        replicate.advance(3600)
        assert replicate.prediction(made)["data_removed"] is True
        second = episode.generate(collect_timeout_s=60.0)
        assert second.counts.paid_submissions == 0 and replicate.jobs_made_total == 1
        assert "buys it again" in second.message, second.message
        assert _ledger(engine) == [("failed", 3_000, True)]
        from episodic.cli.app import run

        assert (
            run(
                [
                    "media",
                    "restore",
                    episode.episode_id,
                    "--pipeline",
                    "weekly",
                    "--buy-again",
                    "--yes",
                ]
            )
            == 0
        )
        assert replicate.jobs_made_total == 2 and replicate.bill_micros == 6_000
        with engine.connect() as conn:
            ledger = conn.execute(select(func.sum(CostEntryRow.amount_micros))).scalar_one()
        assert ledger == replicate.bill_micros


def test_the_stand_ins_throttle_is_waited_out_and_each_item_is_one_prediction(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Against the Replicate stand-in: the next four creates answer 429 "Request was
    throttled. Expected available in 1 second." with Retry-After: 1 (four quick tries failed
    the item before); the run completes, seven creates in all, one prediction per item."""
    from tests.standins import ReplicateStandIn

    with ReplicateStandIn() as replicate:
        replicate.throttle(4, retry_after=1)
        _standin_profile(tmp_path, monkeypatch, replicate.base_url)
        episode = new_episode(engine)
        episode.plan(write_playlist(tmp_path / "pl", ["a", "b", "c"], profile="real"))
        outcome = episode.generate(concurrency=1)
        assert outcome.exit_code == ExitCode.OK, outcome.message
        assert len(replicate.create_requests) == 7
        assert replicate.jobs_made_total == 3 and set(replicate.jobs_made.values()) == {1}
        assert replicate.bill_micros == 9_000
