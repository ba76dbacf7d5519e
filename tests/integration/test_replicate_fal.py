"""The Replicate and fal adapters against local servers that follow each API's documented
shapes (tests/jobs_servers.py): the exact requests sent, what each fault proves, and runs
through the engine on both backends, with money counted by the servers (jobs made)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select

from episodic.core.exit_codes import ExitCode
from episodic.providers.base import (
    CannotCheck,
    ImageRequest,
    PermanentProviderError,
    RateLimited,
    RemoteJobFailed,
    UnknownOutcome,
)
from episodic.providers.fal import FalProvider
from episodic.providers.profiles import Profile, load_profiles
from episodic.providers.replicate import ReplicateProvider
from episodic.storage.models import ItemRow
from tests.generation import Episode, new_episode, write_playlist
from tests.jobs_servers import TOKEN, FalServer, ReplicateServer

VERSION = "a" * 64
REQUEST = ImageRequest("ref-1", "2026-W32-1", "v01", "a red fox", 1234)


def replicate_profile(server: ReplicateServer, **fields: Any) -> Profile:
    values: dict[str, Any] = {
        "id": "rep",
        "kind": "replicate",
        "model": "black-forest-labs/flux-schnell",
        "base_url": server.base_url,
        "credential_env": "REPLICATE_API_TOKEN",
        "cost_per_image_minor": 3,
        "inputs": {"num_outputs": 1, "aspect_ratio": "16:9"},
        "timeout_s": 2.0,
        "poll_interval_s": 0.02,
        "lookup_by_input": True,  # these tests' account serves one installation
    }
    return Profile(**(values | fields))


def fal_profile(server: FalServer, **fields: Any) -> Profile:
    values: dict[str, Any] = {
        "id": "falp",
        "kind": "fal",
        "model": "fal-ai/flux/dev",
        "base_url": server.base_url,
        "schema_url": server.schema_url,
        "credential_env": "FAL_KEY",
        "cost_per_image_minor": 2,
        "inputs": {"image_size": "landscape_16_9", "num_images": 1},
        "timeout_s": 2.0,
        "poll_interval_s": 0.02,
    }
    return Profile(**(values | fields))


@pytest.fixture
def replicate() -> Iterator[ReplicateServer]:
    with ReplicateServer() as server:
        yield server  # type: ignore[misc]


@pytest.fixture
def fal() -> Iterator[FalServer]:
    with FalServer() as server:
        yield server  # type: ignore[misc]


def never_stop() -> bool:
    return False


# ---------------------------------------------------------------- Replicate, the adapter
def test_replicate_sends_exactly_the_documented_create_poll_and_download(
    replicate: ReplicateServer,
) -> None:
    provider = ReplicateProvider(profile=replicate_profile(replicate), token=TOKEN)
    prediction = provider.submit(REQUEST)
    result = provider.collect(prediction, deadline_s=5, should_stop=never_stop)
    assert result.content.startswith(b"\x89PNG") and result.reported_micros is None
    # Replicate reports no cost; its metrics.predict_time (seconds), exactly in microseconds
    assert result.compute_us == 2_803_618
    create, *polls = replicate.requests
    assert create.method == "POST"
    assert create.path == "/v1/models/black-forest-labs/flux-schnell/predictions"
    assert create.headers["authorization"] == f"Bearer {TOKEN}"
    assert "idempotency-key" not in create.headers  # Replicate documents none
    assert [(p.method, p.path) for p in polls] == [("GET", f"/v1/predictions/{prediction}")] * 2
    (download,) = replicate.files.requests
    assert "authorization" not in download.headers  # the credential stays on the API origin
    (job,) = replicate.jobs.values()
    assert job["input"] == {
        "num_outputs": 1,
        "aspect_ratio": "16:9",
        "prompt": "a red fox",
        "seed": 1234,
    }


def test_replicate_with_a_pinned_version_creates_on_the_predictions_endpoint(
    replicate: ReplicateServer,
) -> None:
    provider = ReplicateProvider(profile=replicate_profile(replicate, version=VERSION), token=TOKEN)
    provider.submit(REQUEST)
    (create,) = replicate.requests
    assert create.path == "/v1/predictions"
    (job,) = replicate.jobs.values()
    assert job["version"] == VERSION


@pytest.mark.parametrize("as_string", [False, True])
def test_replicate_output_as_a_list_or_a_single_url_is_downloaded(as_string: bool) -> None:
    with ReplicateServer(output_as_string=as_string) as server:
        provider = ReplicateProvider(profile=replicate_profile(server), token=TOKEN)  # type: ignore[arg-type]
        result = provider.collect(provider.submit(REQUEST), deadline_s=5, should_stop=never_stop)
        assert result.content.startswith(b"\x89PNG")


@pytest.mark.parametrize(
    ("marker", "error"),
    [
        ("[[HTTP_429]]", RateLimited),
        ("[[REFUSE_422]]", PermanentProviderError),
        ("[[HTTP_401]]", PermanentProviderError),
        ("[[CREATED_502]]", UnknownOutcome),
        ("[[ACCEPT_DROP]]", UnknownOutcome),
    ],
)
def test_replicate_create_errors_are_classified_by_what_they_prove(
    replicate: ReplicateServer, marker: str, error: type[Exception]
) -> None:
    provider = ReplicateProvider(profile=replicate_profile(replicate), token=TOKEN)
    request = ImageRequest("ref-1", "2026-W32-1", "v01", f"fox {marker}", 1)
    with pytest.raises(error):
        provider.submit(request)
    made = sum(replicate.jobs_made.values())
    assert made == (1 if error is UnknownOutcome else 0)  # "not created" proves no job
    if error is UnknownOutcome:  # the job exists: the lookup finds exactly it
        (job_id,) = replicate.jobs
        assert provider.lookup(request.client_reference, request) == job_id


def test_replicate_declares_no_lookup_unless_one_installation_uses_the_account(
    replicate: ReplicateServer,
) -> None:
    """A prediction carries nothing of ours: by default nothing is looked up by input (a
    staging on the same account sends production's very input), and nothing is asked."""
    default = replicate_profile(replicate, lookup_by_input=False)
    provider = ReplicateProvider(profile=default, token=TOKEN)
    assert not provider.capabilities.can_lookup
    with pytest.raises(UnknownOutcome, match="lookup_by_input"):
        provider.lookup(REQUEST.client_reference, REQUEST)
    assert replicate.requests == []
    declared = ReplicateProvider(profile=replicate_profile(replicate), token=TOKEN)
    assert declared.capabilities.can_lookup


def test_replicate_lookup_matches_the_exact_input_across_pages_and_refuses_ambiguity() -> None:
    with ReplicateServer(page_size=2) as server:
        provider = ReplicateProvider(profile=replicate_profile(server), token=TOKEN)  # type: ignore[arg-type]
        mine = provider.submit(REQUEST)
        for n in range(5):  # newer predictions push ours to the third page
            provider.submit(ImageRequest(f"ref-x{n}", "2026-W32-1", "v02", "a red fox", n))
        assert provider.lookup(REQUEST.client_reference, REQUEST) == mine
        cursors = [r.path for r in server.requests if r.path.startswith("/v1/predictions?")]
        assert len(cursors) == 3 and "created_after=" in cursors[0]
        other_seed = ImageRequest("ref-2", "2026-W32-1", "v01", "a red fox", 99)
        assert provider.lookup("ref-2", other_seed) is None
        provider.submit(REQUEST)  # a second prediction with our very input: which is ours?
        with pytest.raises(UnknownOutcome, match="ambiguous"):
            provider.lookup(REQUEST.client_reference, REQUEST)


def test_replicate_failed_canceled_and_aborted_predictions_and_their_cost(
    replicate: ReplicateServer,
) -> None:
    provider = ReplicateProvider(profile=replicate_profile(replicate), token=TOKEN)
    failed = provider.submit(ImageRequest("r1", "e", "v01", "x [[REMOTE_FAIL]]", 1))
    with pytest.raises(RemoteJobFailed) as raised:
        provider.collect(failed, deadline_s=5, should_stop=never_stop)
    # failed on its own: billed (Replicate bills the time it ran), its predict_time read
    assert raised.value.billed and not raised.value.cancelled
    assert raised.value.compute_us == 2_803_618
    aborted = provider.submit(ImageRequest("r2", "e", "v01", "x [[ABORTED]]", 2))
    with pytest.raises(RemoteJobFailed) as raised:
        provider.collect(aborted, deadline_s=5, should_stop=never_stop)
    assert not raised.value.billed  # aborted before it started: not billed
    running = provider.submit(ImageRequest("r3", "e", "v01", "y", 3))
    assert provider.cancel(running) == "canceled"
    assert replicate.cancels[running] == 1
    with pytest.raises(RemoteJobFailed) as raised:
        provider.collect(running, deadline_s=5, should_stop=never_stop)
    assert raised.value.cancelled  # the provider's status says so: a run may buy it anew


def test_replicate_check_verifies_the_token_without_spending(replicate: ReplicateServer) -> None:
    assert ReplicateProvider(profile=replicate_profile(replicate), token=TOKEN).check() == (
        "Replicate accepted the token (account episodic-test); model "
        "black-forest-labs/flux-schnell takes every configured input (prompt, seed, "
        "num_outputs, aspect_ratio)"
    )
    from episodic.core.errors import ProviderConfigError

    with pytest.raises(ProviderConfigError, match="refused the token"):
        ReplicateProvider(profile=replicate_profile(replicate), token="wrong").check()
    assert not replicate.jobs_made and "wrong" not in json.dumps(
        [r.path for r in replicate.requests]
    )


# ---------------------------------------------------------------- fal, the adapter
def test_fal_sends_exactly_the_documented_submit_status_result_and_download(
    fal: FalServer,
) -> None:
    provider = FalProvider(profile=fal_profile(fal), token=TOKEN)
    request_id = provider.submit(REQUEST)
    result = provider.collect(request_id, deadline_s=5, should_stop=never_stop)
    assert result.content.startswith(b"\x89PNG") and result.reported_micros is None
    assert result.compute_us == 2_803_618  # metrics.inference_time of the COMPLETED status
    submit, *rest = fal.requests
    assert (submit.method, submit.path) == ("POST", "/fal-ai/flux/dev")
    assert submit.headers["authorization"] == f"Key {TOKEN}"
    assert "idempotency-key" not in submit.headers
    base = f"/fal-ai/flux/requests/{request_id}"  # without the subpath, as documented
    assert [(r.method, r.path) for r in rest] == [("GET", f"{base}/status")] * 2 + [("GET", base)]
    (download,) = fal.files.requests
    assert "authorization" not in download.headers
    (job,) = fal.jobs.values()
    assert job["input"] == {
        "image_size": "landscape_16_9",
        "num_images": 1,
        "prompt": "a red fox",
        "seed": 1234,
    }


@pytest.mark.parametrize(
    ("marker", "error"),
    [
        ("[[HTTP_429]]", RateLimited),
        ("[[REFUSE_422]]", PermanentProviderError),
        ("[[CREATED_502]]", UnknownOutcome),
        ("[[ACCEPT_DROP]]", UnknownOutcome),
    ],
)
def test_fal_submit_errors_are_classified_and_an_unknown_is_never_looked_up_or_resent(
    fal: FalServer, marker: str, error: type[Exception]
) -> None:
    provider = FalProvider(profile=fal_profile(fal), token=TOKEN)
    assert not provider.capabilities.can_lookup and not provider.capabilities.idempotent_create
    request = ImageRequest("ref-1", "2026-W32-1", "v01", f"fox {marker}", 1)
    with pytest.raises(error):
        provider.submit(request)
    assert sum(fal.jobs_made.values()) == (1 if error is UnknownOutcome else 0)
    with pytest.raises(UnknownOutcome):
        provider.lookup(request.client_reference, request)


def test_fal_failed_request_cancel_and_check(fal: FalServer) -> None:
    provider = FalProvider(profile=fal_profile(fal), token=TOKEN)
    failed = provider.submit(ImageRequest("r1", "e", "v01", "x [[REMOTE_FAIL]]", 1))
    with pytest.raises(RemoteJobFailed) as raised:
        provider.collect(failed, deadline_s=5, should_stop=never_stop)
    # "You pay only for successful outputs" (fal's pricing docs): a failure is not billed
    assert not raised.value.billed and fal.bill_micros == 0
    queued = provider.submit(ImageRequest("r2", "e", "v01", "y", 2))
    assert provider.cancel(queued) == "CANCELLATION_REQUESTED"
    assert provider.cancel(failed) == "ALREADY_COMPLETED"
    with pytest.raises(CannotCheck):
        provider.check()


# ---------------------------------------------------------------- profiles
@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"kind": "replicate", "credential_env": "T"}, "needs model"),
        ({"kind": "replicate", "model": "a/b"}, "needs credential_env"),
        ({"kind": "fal", "model": "a/b", "credential_env": "T", "version": VERSION}, "version"),
        (
            {"kind": "replicate", "model": "a/b", "credential_env": "T", "lookup": False},
            "does not declare",
        ),
        (
            {"kind": "replicate", "model": "a/b", "credential_env": "T", "inputs": {"seed": 1}},
            "set per item",
        ),
        (
            {"kind": "fal", "model": "a/b", "credential_env": "T", "inputs": {"x": float("nan")}},
            "finite",
        ),
        ({"kind": "fal", "model": "../etc", "credential_env": "T"}, "model"),
        ({"kind": "replicate", "model": "a/b/c", "credential_env": "T"}, "owner/name"),
        (
            {"kind": "fal", "model": "a/b", "credential_env": "T", "inputs": {"n": 10**60}},
            "2\\^53",
        ),
        ({"kind": "http", "base_url": "http://xn--/v1"}, "valid host"),
        ({"kind": "http", "base_url": "http://h:99999/v1"}, "valid host"),
        ({"kind": "http", "base_url": "http://h/v1?x=1"}, "query"),
        ({"kind": "http", "base_url": "http://h", "model": "a/b"}, "has none"),
        (
            {"kind": "fal", "model": "a/b", "credential_env": "T", "lookup_by_input": True},
            "only a replicate profile",
        ),
        (
            {
                "kind": "replicate",
                "model": "a/b",
                "credential_env": "T",
                "seed_input": None,
                "lookup_by_input": True,
            },
            "takes no seed",
        ),
    ],
)
def test_a_profile_that_does_not_fit_its_kind_is_refused_naming_the_field(
    tmp_path: Path, fields: dict[str, Any], message: str
) -> None:
    import yaml

    from episodic.core.errors import ProviderConfigError

    path = tmp_path / "providers.yaml"
    path.write_text(yaml.safe_dump({"profiles": {"p": {"cost_per_image_minor": 1, **fields}}}))
    with pytest.raises(ProviderConfigError, match=message):
        load_profiles(path)


# ---------------------------------------------------------------- through the engine
def _episode(
    engine: Engine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
    base_url: str,
    *,
    lookup_by_input: bool = True,  # replicate: these tests' account serves one installation
) -> Episode:
    model = "black-forest-labs/flux-schnell" if kind == "replicate" else "fal-ai/flux/dev"
    by_input = "    lookup_by_input: true\n" if kind == "replicate" and lookup_by_input else ""
    (tmp_path / "providers.yaml").write_text(
        "profiles:\n"
        "  real:\n"
        f"    kind: {kind}\n"
        f"    model: {model}\n"
        f"    base_url: {base_url}\n"
        "    credential_env: IMAGE_KEY\n"
        "    cost_per_image_minor: 3\n"
        "    timeout_s: 2.0\n"
        "    poll_interval_s: 0.02\n" + by_input
    )
    monkeypatch.setenv("EPISODIC_PROVIDERS_FILE", str(tmp_path / "providers.yaml"))
    monkeypatch.setenv("IMAGE_KEY", TOKEN)
    return new_episode(engine)


def test_a_replicate_run_pays_once_per_item_through_lost_replies(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ReplicateServer() as server:
        episode = _episode(engine, tmp_path, monkeypatch, "replicate", server.base_url)  # type: ignore[attr-defined]
        titles = ["a", "b [[CREATED_502]]", "c [[ACCEPT_DROP]]", "d [[HTTP_429:2]]"]
        episode.plan(write_playlist(tmp_path / "pl", titles, profile="real"))
        outcome = episode.generate()
        assert outcome.exit_code == ExitCode.OK, outcome.message
        assert sorted(server.jobs_made.values()) == [1, 1, 1, 1]  # the provider's own count
        sent = sorted(
            (next((m for m in ("502", "DROP", "429") if m in prompt), "-"), n)
            for (prompt, _seed), n in server.create_calls.items()
        )  # only the refused create was sent again; a lost reply's create never was
        assert sent == [("-", 1), ("429", 3), ("502", 1), ("DROP", 1)], sent
        assert outcome.counts.cost_micros == 120_000  # 4 x 3 cents, in micro-units
        again = episode.generate()
        assert again.counts.paid_submissions == 0 and sum(server.jobs_made.values()) == 4


def test_a_fal_run_leaves_an_unknown_submit_to_an_operator_and_never_resends_it(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with FalServer() as server:
        episode = _episode(engine, tmp_path, monkeypatch, "fal", server.base_url)  # type: ignore[attr-defined]
        titles = ["a", "b [[CREATED_502]]", "c [[HTTP_429:1]]"]
        episode.plan(write_playlist(tmp_path / "pl", titles, profile="real"))
        outcome = episode.generate()
        assert outcome.exit_code == ExitCode.PARTIAL, outcome.message
        assert outcome.counts.completed == 2 and outcome.counts.failed == 1
        for _ in range(2):  # resumes: the unknown stays unknown, nothing is sent again
            again = episode.generate()
            assert again.counts.failed == 1 and again.counts.paid_submissions == 0
        assert sorted(server.jobs_made.values()) == [1, 1, 1]
        with engine.connect() as conn:
            (error,) = conn.execute(
                select(ItemRow.error_text).where(ItemRow.state == "failed")
            ).one()
        assert "can neither look jobs up nor dedupe creates" in error
        assert "a request to fal-ai/flux/dev (prompt of item v02.p1, seed " in error, error


# ---------------------------------------------------------------- cancelling a run
def test_cancelling_a_run_cancels_its_accepted_jobs_at_the_provider_and_records_it(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run whose prediction is running at Replicate is cancelled: the run stops, the
    prediction is cancelled there (the server counts the cancel call), the ledger records
    the provider's answer, and a cancel again asks only for what is still accepted (here
    nothing: the stopping process saw the prediction end cancelled and closed it)."""
    import threading
    import time

    from episodic.pipeline.cancel import cancel_run
    from episodic.pipeline.gate import EnvironmentCredentials
    from episodic.storage.ledger import LedgerStore
    from episodic.storage.models import EpisodeEventRow, SubmissionRow
    from episodic.storage.runs import RunStore

    with ReplicateServer(processing_polls=10**6) as server:  # it never finishes by itself
        episode = _episode(engine, tmp_path, monkeypatch, "replicate", server.base_url)  # type: ignore[attr-defined]
        episode.plan(write_playlist(tmp_path / "pl", ["slow"], profile="real"))
        outcomes: list[Any] = []
        worker = threading.Thread(target=lambda: outcomes.append(episode.generate(lease_s=5)))
        worker.start()
        deadline = time.monotonic() + 20
        accepted: list[tuple[int, str, str]] = []
        while not accepted and time.monotonic() < deadline:
            (run,) = RunStore(engine).list_runs("weekly", episode.episode_id) or [None]
            accepted = LedgerStore(engine).accepted_jobs(run.run_id) if run else []
            time.sleep(0.05)
        assert accepted, "the prediction was never accepted"
        state, jobs = cancel_run(engine, episode.settings, run.run_id, EnvironmentCredentials())
        worker.join(30)
        assert not worker.is_alive() and outcomes[0].state.value == "cancelled"
        assert state == "cancelled" and [j.answer for j in jobs] == ["canceled"]
        (job_id,) = server.jobs
        assert server.cancels[job_id] == 1 and server.jobs[job_id]["status"] == "canceled"
        with engine.connect() as conn:
            (event,) = conn.execute(
                select(EpisodeEventRow.detail).where(EpisodeEventRow.kind == "provider_cancel")
            ).one()
            assert event["remote_ref"] == job_id and event["answer"] == "canceled"
        # the stopping process saw the prediction end "canceled" and closed its submission
        with engine.connect() as conn:
            assert conn.execute(select(SubmissionRow.state)).scalar_one() == "failed"
        _state, again = cancel_run(engine, episode.settings, run.run_id, EnvironmentCredentials())
        assert again == [] and server.cancels[job_id] == 1  # nothing left to cancel
        assert sum(server.jobs_made.values()) == 1


# ---------------------------------------------------------------- episodic providers
def test_providers_check_verifies_without_spending_and_prints_the_capability_row(
    replicate: ReplicateServer,
    fal: FalServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from episodic.cli.app import run

    (tmp_path / "providers.yaml").write_text(
        "profiles:\n"
        "  rep:\n    kind: replicate\n    model: owner/model\n"
        f"    base_url: {replicate.base_url}\n    credential_env: REP_TOKEN\n"
        "    cost_per_image_minor: 3\n"
        "  falp:\n    kind: fal\n    model: fal-ai/flux/dev\n"
        f"    base_url: {fal.base_url}\n    credential_env: FAL_TOKEN\n"
        f"    schema_url: {fal.schema_url}\n"
        "    cost_per_image_minor: 2\n"
    )
    monkeypatch.setenv("EPISODIC_PROVIDERS_FILE", str(tmp_path / "providers.yaml"))
    monkeypatch.setenv("REP_TOKEN", TOKEN)
    monkeypatch.setenv("FAL_TOKEN", TOKEN)
    capsys.readouterr()
    assert run(["providers", "check", "rep", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["check"] == {
        "ok": True,
        "message": "Replicate accepted the token (account episodic-test); model owner/model "
        "takes every configured input (prompt, seed)",
    }
    assert shown["idempotent_create"] is False and shown["lookup"].startswith("no (")
    assert "lookup_by_input" in shown["lookup"]  # found by input only on one's own account
    assert [r.path for r in replicate.requests] == ["/v1/account", "/v1/models/owner/model"]
    monkeypatch.setenv("REP_TOKEN", "wrong-token")
    assert run(["providers", "check", "rep"]) == 2
    assert "refused the token" in capsys.readouterr().out
    assert run(["providers", "check", "falp", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (
        shown["check"]["ok"] is None
        and "the key cannot be checked without spending" in shown["check"]["message"]
    )
    (schema,) = fal.files.requests  # fal's public schema, read without the key
    assert schema.path.startswith("/api/openapi/queue/openapi.json?endpoint_id=fal-ai")
    assert "authorization" not in schema.headers
    assert shown["on_ambiguous_reply"] == "left to an operator (never sent again)"
    assert fal.requests == [] and not replicate.jobs_made  # nothing sent that could spend
    assert run(["providers", "list", "--json"]) == 0
    assert [row["profile"] for row in json.loads(capsys.readouterr().out)] == [
        "fake",
        "falp",
        "rep",
    ]
    assert run(["providers", "check", "nope"]) == 2
    assert "unknown provider profile 'nope'" in capsys.readouterr().err


# ---------------------------------------------------------------- reference images
def _playlist_with_reference(folder: Path, profile: str, image: bytes) -> Path:
    import yaml

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "style.png").write_bytes(image)
    path = folder / "playlist.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "template": {"id": "cover", "version": 1, "prompt": "cover for {title}"},
                "provider_profile": profile,
                "reference_assets": ["style.png"],
                "reference_image": "style.png",
                "items": [
                    {"video_id": "v01", "title": "fox", "seed": 11},
                    {"video_id": "v02", "title": "owl [[CREATED_502]]", "seed": 12},
                ],
            }
        )
    )
    return path


def test_the_planned_reference_image_is_what_every_item_sends(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan keeps the reference image's bytes; each create sends them as a data: URI
    under the profile's input name, even after the file changed on disk; a lost reply is
    still found by the lookup (the image is left out of the exact-input match)."""
    import base64
    import hashlib

    from episodic.providers.fake import render_png

    planned = render_png("style", 1)
    with ReplicateServer() as server:
        episode = _episode(engine, tmp_path, monkeypatch, "replicate", server.base_url)  # type: ignore[attr-defined]
        profiles = tmp_path / "providers.yaml"
        profiles.write_text(profiles.read_text() + "    reference_image_input: image\n")
        path = _playlist_with_reference(tmp_path / "pl", "real", planned)
        episode.plan(path)
        (path.parent / "style.png").write_bytes(render_png("changed", 2))  # after planning
        outcome = episode.generate()
        assert outcome.exit_code == ExitCode.OK, outcome.message
        assert sorted(server.jobs_made.values()) == [1, 1]
        for job in server.jobs.values():
            uri = job["input"]["image"]
            assert uri.startswith("data:image/png;base64,")
            assert base64.b64decode(uri.split(",", 1)[1]) == planned
    with FalServer() as server:  # a fal profile without the input name is refused, unspent
        episode2 = new_episode(engine, key="test:2")
        (tmp_path / "providers.yaml").write_text(
            "profiles:\n  real:\n    kind: fal\n    model: fal-ai/flux/dev\n"
            f"    base_url: {server.base_url}\n    credential_env: IMAGE_KEY\n"
            "    cost_per_image_minor: 3\n"
        )
        episode2.plan(_playlist_with_reference(tmp_path / "pl2", "real", planned))
        from episodic.core.errors import ProviderConfigError

        with pytest.raises(ProviderConfigError, match="reference_image_input"):
            episode2.generate()
        assert server.requests == []
    assert hashlib.sha256(planned).hexdigest() != hashlib.sha256(b"").hexdigest()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"reference_image": "other.png"}, "one of reference_assets"),
        ({"reference_assets": ["style.txt"], "reference_image": "style.txt"}, "file"),
    ],
)
def test_a_reference_image_that_is_not_an_image_asset_is_refused(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    import yaml

    from episodic.core.errors import InvalidPlaylist
    from episodic.pipeline.playlists import load_playlist

    path = _playlist_with_reference(tmp_path, "fake", b"\x89PNG")
    (tmp_path / "style.txt").write_text("x")
    data = yaml.safe_load(path.read_text()) | change
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(InvalidPlaylist, match=message):
        load_playlist(path)


def test_a_replicate_unknown_without_a_seed_tells_the_operator_where_to_look(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model without a seed cannot be looked up; the hint names the model and the item's
    prompt in Replicate's prediction list, not our client reference, which never reaches
    Replicate (an operator would not find the prediction that was made, and
    --force-resubmit would pay twice)."""
    with ReplicateServer() as server:
        episode = _episode(
            engine,
            tmp_path,
            monkeypatch,
            "replicate",
            server.base_url,  # type: ignore[attr-defined]
            lookup_by_input=False,  # a model without a seed cannot declare it
        )
        profiles = tmp_path / "providers.yaml"
        profiles.write_text(profiles.read_text() + "    seed_input: null\n")
        episode.plan(write_playlist(tmp_path / "pl", ["owl [[CREATED_502]]"], profile="real"))
        assert episode.generate().exit_code == ExitCode.RUN_FAILED
        with engine.connect() as conn:
            (error,) = conn.execute(select(ItemRow.error_text)).one()
        assert "a prediction of black-forest-labs/flux-schnell (prompt of item v01.p1)" in error
        assert "client reference" not in error
        (job,) = server.jobs.values()
        assert "seed" not in job["input"]


@pytest.mark.slow
def test_cancel_asks_for_a_failed_runs_uncollected_jobs_and_says_when_it_could_not(
    engine: Engine,
    database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A run that ended failed with jobs left for later collection can be cancelled, so its
    running predictions are stopped: the failed run keeps its state and its jobs are asked;
    a cancel that could not ask (no credential) exits 1 with the reason, never
    "cancelled", exit 0."""
    from episodic.cli.app import run

    with ReplicateServer(processing_polls=10**6) as server:
        episode = _episode(engine, tmp_path, monkeypatch, "replicate", server.base_url)  # type: ignore[attr-defined]
        episode.plan(write_playlist(tmp_path / "pl", ["a", "b"], profile="real"))
        first = episode.generate(collect_timeout_s=0.3)
        assert first.state.value == "failed"
        monkeypatch.delenv("IMAGE_KEY")
        capsys.readouterr()
        assert run(["runs", "cancel", first.run_id]) == 1
        out, err = capsys.readouterr()
        assert out.count("not asked: ") == 2 and "$IMAGE_KEY is not set" in err, (out, err)
        assert sum(server.cancels.values()) == 0
        monkeypatch.setenv("IMAGE_KEY", TOKEN)
        assert run(["runs", "cancel", first.run_id, "--json"]) == 0
        shown = json.loads(capsys.readouterr().out)
        assert shown["state"] == "failed"
        assert [c["answer"] for c in shown["provider_cancels"]] == ["canceled", "canceled"]
        assert sorted(server.cancels.values()) == [1, 1] and sum(server.jobs_made.values()) == 2


def test_a_hostile_account_name_never_reaches_the_terminal_raw(replicate: ReplicateServer) -> None:
    hostile = {"username": "\x1b[2J\x1b[31mPWNED\x07"}
    replicate.reply = lambda kind, path: (200, hostile) if path == "/v1/account" else None
    said = ReplicateProvider(profile=replicate_profile(replicate), token=TOKEN).check()
    assert said.startswith("Replicate accepted the token (account [2J[31mPWNED); ")


def test_a_number_past_pythons_digit_limit_in_a_yaml_file_is_one_line_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 5001-digit integer in providers.yaml (and so in any YAML file we read) is a mistake
    in the file, not "unexpected ValueError", exit 1."""
    from episodic.cli.app import run

    (tmp_path / "providers.yaml").write_text(
        "profiles:\n  p:\n    kind: fal\n    model: a/b\n    credential_env: T\n"
        f"    cost_per_image_minor: 1\n    inputs: {{x: {'9' * 5001}}}\n"
    )
    monkeypatch.setenv("EPISODIC_PROVIDERS_FILE", str(tmp_path / "providers.yaml"))
    capsys.readouterr()
    assert run(["providers", "list"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "unexpected" not in err


# ---------------------------------------------------------------- a download refused
@pytest.mark.parametrize("kind", ["replicate", "fal"])
def test_a_download_refused_for_a_credential_ends_the_collect_fast_and_never_buys_again(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """A 403 from the output's host is not polled until the collect deadline: one fresh poll
    (an expired signature gets a new URL), then the item is left to be collected (it was
    paid), its error naming the host, never the URL's signature; nothing is bought again."""
    server_type = ReplicateServer if kind == "replicate" else FalServer
    with server_type() as server:
        server.refuse_downloads = 403
        server.output_query = "?X-Amz-Signature=SIGNATURE-NOT-TO-SHOW"
        episode = _episode(engine, tmp_path, monkeypatch, kind, server.base_url)  # type: ignore[attr-defined]
        episode.plan(write_playlist(tmp_path / "pl", ["a"], profile="real"))
        outcome = episode.generate(collect_timeout_s=60.0)
        assert outcome.exit_code != ExitCode.OK and outcome.counts.completed == 0
        downloads = [r for r in server.files.requests if r.method == "GET"]
        assert len(downloads) == 2, downloads  # the first, and one after a fresh poll
        assert sum(server.jobs_made.values()) == 1
        with engine.connect() as conn:
            (error,) = conn.execute(select(ItemRow.error_text)).one()
        host = server.files.origin.removeprefix("http://")
        assert (
            f"download from {host} refused (403): the output URL needs a credential or has "
            "expired" in error
        ), error
        assert "SIGNATURE" not in error and "/files/" not in error, error
        again = episode.generate(collect_timeout_s=60.0)  # collects again, buys nothing
        assert again.counts.paid_submissions == 0 and sum(server.jobs_made.values()) == 1
        server.refuse_downloads = None  # the host lets us in: the paid job is collected
        done = episode.generate(collect_timeout_s=60.0)
        assert done.exit_code == ExitCode.OK, done.message
        assert sum(server.jobs_made.values()) == 1 and done.counts.completed == 1
