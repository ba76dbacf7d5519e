"""The provider's own words reach the operator, and a paid call whose outcome is unknown
resolves or is handed over: against the local Replicate- and fal-shaped servers
(tests/jobs_servers.py), money counted by the servers (jobs made, creates received), on
SQLite and PostgreSQL where the ledger is touched."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from sqlalchemy import Engine, select

from episodic.core.exit_codes import ExitCode
from episodic.providers.base import ImageRequest
from episodic.providers.profiles import Profile
from episodic.providers.replicate import ReplicateProvider
from episodic.storage.models import ItemRow, SubmissionRow
from tests.generation import Episode, new_episode, write_playlist
from tests.integration.test_replicate_fal import _episode
from tests.jobs_servers import TOKEN, FalServer, ReplicateServer

PROMPT = "cover for fox part 1"  # write_playlist's prompt of title "fox"
SEED = 101  # its seed for the first video


def _creates(server: ReplicateServer | FalServer) -> int:
    return sum(1 for seen in server.requests if seen.method == "POST")


def _item_error(engine: Engine, episode: Episode) -> str:
    from episodic.storage.models import EpisodeRow

    with engine.connect() as conn:
        pk = conn.execute(
            select(EpisodeRow.id).where(EpisodeRow.episode_id == episode.episode_id)
        ).scalar_one()
        return str(
            conn.execute(select(ItemRow.error_text).where(ItemRow.episode_pk == pk)).scalar_one()
        )


# ---------------------------------------------------------------- the one sanitizer
def test_provider_text_is_bounded_printable_and_never_carries_the_token() -> None:
    from episodic.core.provider_text import problem_words, provider_words

    hostile = "CUDA out of memory\x1b[2J\r\nTried " + TOKEN + " \u202e" + "x" * 900
    said = provider_words(hostile, secrets=[TOKEN])
    assert said.startswith("CUDA out of memory Tried [redacted]"), said
    assert TOKEN not in said and len(said) <= 300 and said.isprintable()
    # a token cut in half by the bound never shows its head: struck out before the cut
    near_end = "y" * 295 + TOKEN
    assert TOKEN[:5] not in provider_words(near_end, secrets=[TOKEN])
    # shapes of credentials the caller does not know are struck too
    assert "r8_" not in provider_words("use r8_abcdefghijklmnop please")
    assert "abcdefghijkl" not in provider_words("Authorization: Bearer abcdefghijkl")
    body = {"title": "Insufficient credit", "status": 402, "detail": "Add credit."}
    assert problem_words(body) == "Insufficient credit: Add credit."
    fal_422 = {"detail": [{"loc": ["body", "prompt"], "msg": "field required"}]}
    assert problem_words(fal_422) == "body.prompt: field required"
    assert problem_words(["not", "a", "problem"]) == ""
    # a title the detail repeats is said once (Replicate's 429 problem document)
    throttled = {
        "title": "Request was throttled",
        "status": 429,
        "detail": "Request was throttled. Expected available in 1 second.",
    }
    assert problem_words(throttled) == "Request was throttled. Expected available in 1 second."


# ---------------------------------------------------------------- failed jobs, refusals
@pytest.mark.parametrize("kind", ["replicate", "fal"])
def test_a_failed_jobs_own_error_reaches_the_item_runs_show_and_the_runs_last_line(
    engine: Engine,
    database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    kind: str,
) -> None:
    from episodic.cli.app import run

    server = ReplicateServer() if kind == "replicate" else FalServer()
    with server:
        server.failure_text = f"CUDA out of memory.\n\x1b[31mTried to allocate 20.00 GiB {TOKEN}"
        episode = _episode(engine, tmp_path, monkeypatch, kind, server.base_url)
        episode.plan(write_playlist(tmp_path / "pl", ["fox [[REMOTE_FAIL]]"], profile="real"))
        outcome = episode.generate()
        assert outcome.exit_code == ExitCode.RUN_FAILED
        error = _item_error(engine, episode)
        assert "CUDA out of memory. Tried to allocate 20.00 GiB [redacted]" in error, error
        assert "CUDA out of memory." in outcome.message, outcome.message
        capsys.readouterr()
        assert run(["runs", "show", str(outcome.run_id)]) == 0
        shown = capsys.readouterr().out
        assert "CUDA out of memory." in shown
        for text in (error, outcome.message, shown):
            assert TOKEN not in text and "\x1b" not in text
        assert sum(server.jobs_made.values()) == 1


def test_a_402_problem_detail_is_in_the_message_and_the_last_line_says_add_credit(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ReplicateServer() as server:
        server.problems[402] = {
            "title": "Insufficient credit",
            "status": 402,
            "detail": "You have insufficient credit to run this model. Go to "
            "https://replicate.com/account/billing#billing to purchase credit.",
        }
        episode = _episode(engine, tmp_path, monkeypatch, "replicate", server.base_url)  # type: ignore[attr-defined]
        episode.plan(write_playlist(tmp_path / "pl", ["fox [[HTTP_402:9]]"], profile="real"))
        outcome = episode.generate()
        assert outcome.exit_code == ExitCode.RUN_FAILED
        assert "create refused: HTTP 402 (Insufficient credit: You have insufficient credit" in (
            _item_error(engine, episode)
        )
        message = outcome.message
        assert "Insufficient credit" in message and "add credit" in message, message
        assert "profile 'real'" in message
        assert not message.split("(")[0].endswith("resume with: ")
        assert "resume with:" not in message  # a resume alone cannot help
        assert sum(server.jobs_made.values()) == 0


def test_a_401_names_the_profile_and_where_its_credential_comes_from(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with FalServer() as server:
        server.problems[401] = {"detail": "No user found for Key ID and Secret"}
        episode = _episode(engine, tmp_path, monkeypatch, "fal", server.base_url)  # type: ignore[attr-defined]
        episode.plan(write_playlist(tmp_path / "pl", ["fox [[HTTP_401:9]]"], profile="real"))
        outcome = episode.generate()
        assert outcome.exit_code == ExitCode.RUN_FAILED
        message = outcome.message
        assert "create refused: HTTP 401 (No user found for Key ID and Secret)" in message, message
        assert "refused the credential of profile 'real'" in message
        assert "the environment variable IMAGE_KEY" in message
        assert "episodic providers check real" in message
        assert "resume with:" not in message and TOKEN not in message
        assert sum(server.jobs_made.values()) == 0


def test_providers_check_names_the_url_it_could_not_reach(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from episodic.cli.app import run

    with socket.socket() as probe:  # a port where nothing listens
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    (tmp_path / "providers.yaml").write_text(
        "profiles:\n"
        "  rep:\n    kind: replicate\n    model: owner/model\n"
        f"    base_url: http://127.0.0.1:{port}/v1\n    credential_env: REP_TOKEN\n"
        "    cost_per_image_minor: 3\n"
    )
    monkeypatch.setenv("EPISODIC_PROVIDERS_FILE", str(tmp_path / "providers.yaml"))
    monkeypatch.setenv("REP_TOKEN", TOKEN)
    capsys.readouterr()
    assert run(["providers", "check", "rep"]) == 1
    out = capsys.readouterr().out
    assert f"could not reach http://127.0.0.1:{port}/v1/account (ConnectError)" in out, out
    assert TOKEN not in out


# ---------------------------------------------------------------- unknown outcomes
def _fail_next_create(server: ReplicateServer | FalServer) -> None:
    """The next create makes its job, then the caller hears a 502 (once)."""
    answered = []

    def reply(kind: str, path: str) -> tuple[int, object] | None:
        if kind == "create" and not answered:
            answered.append(path)
            return 502, {"detail": "bad gateway"}
        return None

    server.reply = reply


def test_the_same_playlist_in_two_episodes_resolves_to_its_own_job_not_the_recorded_one(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The seed belongs to the video: a second episode of the same playlist sends the very
    input of the first. After a 500-after-create in the second, the lookup matches both
    predictions; the first is recorded for the first episode's item, so it is not counted,
    and the second episode collects its own prediction (no new create, no loop)."""
    with ReplicateServer() as server:
        first = _episode(engine, tmp_path, monkeypatch, "replicate", server.base_url)  # type: ignore[attr-defined]
        playlist = write_playlist(tmp_path / "pl", ["fox"], profile="real")
        first.plan(playlist)
        assert first.generate().exit_code == ExitCode.OK
        (first_job,) = server.jobs
        second = new_episode(engine, "test:2")
        second.plan(playlist)
        _fail_next_create(server)
        outcome = second.generate()
        assert outcome.exit_code == ExitCode.OK, outcome.message
        assert server.jobs_made[(PROMPT, SEED)] == 2 and _creates(server) == 2
        with engine.connect() as conn:
            refs = conn.execute(select(SubmissionRow.remote_ref).order_by(SubmissionRow.id))
            recorded = list(refs.scalars())
        second_job = next(job for job in server.jobs if job != first_job)
        assert recorded == [first_job, second_job]


def test_an_ambiguity_shows_its_candidates_and_adopting_one_collects_it_without_paying(
    engine: Engine,
    database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Another prediction with the very input (another installation on the account) keeps
    the lookup ambiguous even with the recorded one left out: the item's message, `runs
    show` and the run's last line name both candidates and the adopt command; a resume
    says the same and pays nothing; a wrong model's prediction and the other episode's
    recorded one are refused; the right one is adopted (0 creates) and the resume
    collects it."""
    from episodic.cli.app import run

    with ReplicateServer() as server:
        first = _episode(engine, tmp_path, monkeypatch, "replicate", server.base_url)  # type: ignore[attr-defined]
        playlist = write_playlist(tmp_path / "pl", ["fox"], profile="real")
        first.plan(playlist)
        assert first.generate().exit_code == ExitCode.OK
        (first_job,) = server.jobs
        profile = Profile(
            id="other",
            kind="replicate",
            model="black-forest-labs/flux-schnell",
            base_url=server.base_url,
            credential_env="IMAGE_KEY",
            cost_per_image_minor=3,
        )
        stranger = ReplicateProvider(profile=profile, token=TOKEN)
        stray = stranger.submit(ImageRequest("x", "e", "v01.p1", PROMPT, SEED))
        wrong_model = ReplicateProvider(
            profile=profile.model_copy(update={"model": "someone/else"}), token=TOKEN
        ).submit(ImageRequest("y", "e", "v01.p1", PROMPT, SEED))
        second = new_episode(engine, "test:2")
        second.plan(playlist)
        _fail_next_create(server)
        outcome = second.generate()
        ours = next(j for j in server.jobs if j not in (first_job, stray, wrong_model))
        assert outcome.exit_code == ExitCode.RUN_FAILED
        error = _item_error(engine, second)
        assert "ambiguous: 2 predictions match ours" in error, error
        assert stray in error and ours in error and first_job not in error
        assert f"episodic runs adopt {outcome.run_id} v01.p1 --job ID" in error
        assert "episodic runs adopt" in outcome.message and "resume with:" not in outcome.message
        run_id = str(outcome.run_id)
        capsys.readouterr()
        assert run(["runs", "show", run_id]) == 0
        assert stray in capsys.readouterr().out
        creates = _creates(server)
        again = second.resume(run_id)  # asks again, says the same, pays nothing
        assert again.exit_code == ExitCode.RUN_FAILED and "episodic runs adopt" in again.message
        assert _creates(server) == creates
        assert ours in _item_error(engine, second)

        assert run(["runs", "adopt", run_id, "v01.p1", "--job", first_job]) == 2
        assert (
            f"recorded in the ledger for item v01.p1 of {first.episode_id}"
            in capsys.readouterr().err
        )
        assert run(["runs", "adopt", run_id, "v01.p1", "--job", wrong_model]) == 2
        assert "not flux-schnell" not in (err := capsys.readouterr().err)
        assert "is of model someone/else, not black-forest-labs/flux-schnell" in err, err
        assert run(["runs", "adopt", run_id, "v01.p1", "--job", ours, "--json"]) == 0
        adopted = json.loads(capsys.readouterr().out)
        assert adopted["job"] == ours and adopted["paid_calls"] == 0
        assert _creates(server) == creates  # adopting sent no create
        done = second.resume(run_id)
        assert done.exit_code == ExitCode.OK, done.message
        assert _creates(server) == creates and server.jobs_made[(PROMPT, SEED)] == 4
        with engine.connect() as conn:
            states = conn.execute(
                select(SubmissionRow.remote_ref, SubmissionRow.state).order_by(SubmissionRow.id)
            ).all()
        assert [tuple(s) for s in states] == [(first_job, "succeeded"), (ours, "succeeded")]
        # adopted once, it is never adopted again: the item has its image
        assert run(["runs", "adopt", run_id, "v01.p1", "--job", stray]) == 2


def test_a_fal_request_found_by_the_operator_is_adopted_and_collected_without_paying(
    engine: Engine,
    database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """fal's queue lists nothing: an unknown submit waits for an operator. The other item's
    request is refused (the ledger records it), the right one is verified by the seed and
    prompt its result echoes, adopted, and collected by the resume: no create sent."""
    from episodic.cli.app import run

    with FalServer() as server:
        episode = _episode(engine, tmp_path, monkeypatch, "fal", server.base_url)  # type: ignore[attr-defined]
        episode.plan(write_playlist(tmp_path / "pl", ["a", "b [[CREATED_502]]"], profile="real"))
        outcome = episode.generate()
        assert outcome.exit_code == ExitCode.PARTIAL
        assert "episodic runs adopt" in outcome.message and "v02.p1" in outcome.message
        run_id = str(outcome.run_id)
        by_prompt = {job["input"]["prompt"]: job_id for job_id, job in server.jobs.items()}
        other = by_prompt["cover for a part 1"]
        ours = by_prompt["cover for b [[CREATED_502]] part 1"]
        creates = _creates(server)
        capsys.readouterr()
        assert run(["runs", "adopt", run_id, "v02.p1", "--job", other]) == 2
        err = capsys.readouterr().err
        assert "recorded in the ledger for item v01.p1" in err and err.count("\n") == 1
        assert run(["runs", "adopt", run_id, "v02.p1", "--job", "no-such-request"]) == 2
        assert "fal has no request no-such-request" in capsys.readouterr().err
        # still running: fal shows nothing of its input yet, so it cannot be verified
        assert run(["runs", "adopt", run_id, "v02.p1", "--job", ours]) == 2
        assert "adopt it once it completed" in capsys.readouterr().err
        assert run(["runs", "adopt", run_id, "v02.p1", "--job", ours]) == 0
        out = capsys.readouterr().out
        assert f"job {ours} adopted" in out and "seed 102" in out, out
        done = episode.resume(run_id)
        assert done.exit_code == ExitCode.OK, done.message
        assert _creates(server) == creates and sum(server.jobs_made.values()) == 2
        assert done.counts.completed == 2


def test_a_lookup_leaves_out_a_recorded_job_and_names_the_candidates_that_remain() -> None:
    from episodic.providers.base import AmbiguousLookup
    from tests.integration.test_replicate_fal import replicate_profile

    with ReplicateServer() as server:
        provider = ReplicateProvider(profile=replicate_profile(server), token=TOKEN)
        request = ImageRequest("ref-1", "2026-W32-1", "v01.p1", PROMPT, SEED)
        older, newer = provider.submit(request), provider.submit(request)
        # an earlier attempt's (or another episode's) recorded job is never this call's
        assert provider.lookup("ref-1", request, recorded=lambda ref: ref == older) == newer
        assert provider.lookup("ref-1", request, recorded=lambda ref: True) is None
        with pytest.raises(AmbiguousLookup) as raised:
            provider.lookup("ref-1", request, recorded=lambda ref: False)
        assert [ref for ref, _at in raised.value.candidates] == [older, newer]
        assert all(at.startswith("20") for _ref, at in raised.value.candidates)
        assert _creates(server) == 2


def test_a_fal_result_refused_422_names_the_input_to_fix_and_no_bare_resume(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fal request the queue took, whose result answers 422 (the model's validation of the
    input): the item's message carries the provider's words, the run's last line says to fix
    that input (the same input is refused again) and offers no bare resume; nothing billed."""
    with FalServer() as server:
        episode = _episode(engine, tmp_path, monkeypatch, "fal", server.base_url)  # type: ignore[attr-defined]
        episode.plan(write_playlist(tmp_path / "pl", ["fox [[RESULT_422]]"], profile="real"))
        outcome = episode.generate()
        assert outcome.exit_code == ExitCode.RUN_FAILED
        error = _item_error(engine, episode)
        assert "result refused: HTTP 422" in error and "not a valid preset" in error, error
        message = outcome.message
        assert "fix that input" in message and "profile 'real'" in message, message
        assert "resume with:" not in message, message
        assert sum(server.jobs_made.values()) == 1 and server.bill_micros == 0
