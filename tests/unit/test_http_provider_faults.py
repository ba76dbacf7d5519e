"""The HTTP and fake providers against faults, at the provider level (no database, no engine).

The HTTP provider talks to a real local server (`tests.http_server`); a few reply shapes that
server does not produce use `httpx.MockTransport`.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import episodic.providers.jobs_api as jobs_api
import episodic.providers.lookups as lookups
from episodic.core.errors import ProviderConfigError
from episodic.providers.base import (
    CollectionPending,
    ImageRequest,
    NotCreated,
    PermanentProviderError,
    RateLimited,
    RemoteJobFailed,
    Stopped,
    TransientProviderError,
    UnknownOutcome,
)
from episodic.providers.fake import FakeProvider, render_png
from episodic.providers.http import HttpProvider
from episodic.providers.profiles import BUILTIN, Profile
from tests.http_server import TOKEN, PredictionsServer

REF = "ref-0001"


def image_request(prompt: str = "a lighthouse", ref: str = REF, seed: int = 7) -> ImageRequest:
    return ImageRequest(
        client_reference=ref,
        episode_id="2026-W32-0",
        item_id=f"item-{ref}",
        prompt=prompt,
        seed=seed,
    )


def make_profile(base_url: str, **fields: Any) -> Profile:
    values: dict[str, Any] = {
        "id": "http-test",
        "kind": "http",
        "base_url": base_url,
        "credential_env": "TEST_IMAGE_TOKEN",
        "cost_per_image_minor": 5,
        "timeout_s": 2,
        "poll_interval_s": 0.02,
    }
    return Profile(**(values | fields))


@pytest.fixture
def connect() -> Iterator[Callable[..., HttpProvider]]:
    """Builds providers (closed at teardown): connect(server_or_url, token=..., **profile)."""
    built: list[HttpProvider] = []

    def build(
        target: PredictionsServer | str,
        token: str = TOKEN,
        transport: httpx.BaseTransport | None = None,
        **fields: Any,
    ) -> HttpProvider:
        url = target.base_url if isinstance(target, PredictionsServer) else target
        provider = HttpProvider(
            profile=make_profile(url, **fields), token=token, transport=transport
        )
        built.append(provider)
        return provider

    yield build
    for provider in built:
        provider.close()


def never_stop() -> bool:
    return False


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def posts(server: PredictionsServer) -> int:
    return sum(seen.method == "POST" for seen in server.requests)


# --- create -------------------------------------------------------------------------------

CREATE_FAULTS = [
    ("[[CREATED_502]]", UnknownOutcome, 1),
    ("[[CREATED_504]]", UnknownOutcome, 1),
    ("[[CREATED_409]]", UnknownOutcome, 1),
    ("[[CREATED_422_IDEMPOTENCY]]", UnknownOutcome, 1),
    ("[[MALFORMED_CREATE]]", UnknownOutcome, 1),
    ("[[ACCEPT_DROP]]", UnknownOutcome, 1),
    ("[[HTTP_500]]", UnknownOutcome, 0),  # no job this time, but a 500 cannot prove it
    ("[[HTTP_429]]", RateLimited, 0),
    ("[[REFUSE_422]]", PermanentProviderError, 0),
]


@pytest.mark.parametrize(("marker", "error", "jobs"), CREATE_FAULTS)
def test_each_create_fault_maps_to_what_it_proves_and_is_sent_once(
    connect: Callable[..., HttpProvider], marker: str, error: type[Exception], jobs: int
) -> None:
    with PredictionsServer() as server:
        provider = connect(server)
        with pytest.raises(error) as caught:
            provider.submit(image_request(f"x {marker}"))
        assert type(caught.value) is error
        assert server.create_calls == {REF: 1} and posts(server) == 1  # never retried inside
        assert server.jobs_made[REF] == jobs and server.bill_micros == 50_000 * jobs
        assert "bad gateway" not in str(caught.value) and "example.com" not in str(caught.value)
        # What the engine may do for an idempotent provider: the same call again, same key.
        remote_ref = provider.submit(image_request(f"x {marker}"))
        assert server.jobs_made[REF] == 1 and list(server.jobs) == [remote_ref]


def test_a_422_is_validation_unless_it_is_about_the_idempotency_key(
    connect: Callable[..., HttpProvider],
) -> None:
    with PredictionsServer() as server:
        provider = connect(server)
        with pytest.raises(PermanentProviderError, match=r"HTTP 422 \(validation"):
            provider.submit(image_request("[[REFUSE_422]]", ref="ref-a"))
        with pytest.raises(UnknownOutcome, match="idempotency"):
            provider.submit(image_request("[[CREATED_422_IDEMPOTENCY]]", ref="ref-b"))
        assert server.jobs_made == {"ref-b": 1}


def test_a_reply_that_never_comes_is_unknown(connect: Callable[..., HttpProvider]) -> None:
    with PredictionsServer() as server:
        provider = connect(server, timeout_s=0.3)
        with pytest.raises(UnknownOutcome, match="ReadTimeout"):
            provider.submit(image_request("[[SLOW_MS:1200]]"))
        assert server.jobs_made[REF] == 1 and posts(server) == 1


@pytest.mark.parametrize(("token", "path", "code"), [("wrong", "/v1", 401), (TOKEN, "/v1/x", 404)])
def test_documented_refusals_are_permanent_and_never_echo_the_credential(
    connect: Callable[..., HttpProvider], token: str, path: str, code: int
) -> None:
    with PredictionsServer() as server:
        provider = connect(server.origin + path, token=token)
        with pytest.raises(PermanentProviderError) as caught:
            provider.submit(image_request())
        assert str(code) in str(caught.value) and token not in str(caught.value)
        assert not server.jobs


def test_a_create_that_cannot_connect_is_transient(connect: Callable[..., HttpProvider]) -> None:
    provider = connect(f"http://127.0.0.1:{free_port()}/v1")
    with pytest.raises(TransientProviderError, match="not sent: ConnectError"):
        provider.submit(image_request())


@pytest.mark.parametrize("token", [TOKEN + "\nX-Injected: 1", " " + TOKEN, "", "tök\x00en"])
def test_a_token_with_whitespace_or_control_characters_is_refused_at_construction(
    token: str,
) -> None:
    with pytest.raises(ProviderConfigError) as caught:
        HttpProvider(profile=make_profile("http://127.0.0.1:9/v1"), token=token)
    message = str(caught.value)
    assert "\n" not in message and (not token or token not in message) and TOKEN not in message


def test_a_request_that_cannot_be_sent_is_a_plain_refusal_not_unknown(
    connect: Callable[..., HttpProvider],
) -> None:
    with PredictionsServer() as server:
        with pytest.raises(PermanentProviderError, match="not sent: LocalProtocolError"):
            connect(server).submit(image_request(ref="ref\r\nX-Injected: 1"))  # invalid header
        assert not server.create_calls and posts(server) == 0
    # A URL no provider answers on is refused before any request: when the profile is made.
    with pytest.raises(ValueError, match="http:// or https://"):
        make_profile("ftp://127.0.0.1:21/v1")


# --- collect ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "marker",
    [
        "[[POLL_QUEUED:3]]",
        "[[POLL_401:2]]",
        "[[POLL_500:3]]",
        "[[POLL_BADJSON:2]]",
        "[[DOWNLOAD_404:2]]",
        "[[POLL_500:2]] [[POLL_QUEUED:4]] [[DOWNLOAD_404:1]]",
    ],
)
def test_collect_rides_out_poll_and_download_errors(
    connect: Callable[..., HttpProvider], marker: str
) -> None:
    prompt = f"a harbour {marker}"
    with PredictionsServer() as server:
        provider = connect(server)
        remote_ref = provider.submit(image_request(prompt))
        result = provider.collect(remote_ref, deadline_s=10, should_stop=never_stop)
        assert result.content == render_png(prompt, 7)
        assert result.media_type == "image/png" and result.reported_micros is None
        # no figure of its own: the profile's 5 cents, exactly, in micro-units
        assert provider.capabilities.price.settle(compute_us=result.compute_us).amount_micros == (
            50_000
        )
        assert server.jobs_made[REF] == 1 and posts(server) == 1


def test_a_job_the_provider_says_failed_is_remote_job_failed_billed_at_the_profile_price(
    connect: Callable[..., HttpProvider],
) -> None:
    with PredictionsServer() as server:
        provider = connect(server)
        remote_ref = provider.submit(image_request("[[REMOTE_FAIL]]"))
        with pytest.raises(RemoteJobFailed, match="remote task failed") as caught:
            provider.collect(remote_ref, deadline_s=10, should_stop=never_stop)
        assert caught.value.billed and caught.value.reported_micros is None
        charge = provider.capabilities.price.settle(compute_us=caught.value.compute_us)
        assert charge.amount_micros == 50_000
        # the provider's own words, through the sanitizer (never the raw body nor the token)
        assert str(caught.value) == "remote task failed: the model crashed"


def test_a_job_that_never_finishes_is_pending_at_the_deadline(
    connect: Callable[..., HttpProvider],
) -> None:
    with PredictionsServer(processing_polls=10**9) as server:
        provider = connect(server)
        remote_ref = provider.submit(image_request())
        started = time.monotonic()
        with pytest.raises(CollectionPending, match=r"within 0\.3s: status processing"):
            provider.collect(remote_ref, deadline_s=0.3, should_stop=never_stop)
        assert time.monotonic() - started < 2


def test_a_provider_that_keeps_failing_polls_is_pending_never_permanent(
    connect: Callable[..., HttpProvider],
) -> None:
    with PredictionsServer() as server:
        provider = connect(server)
        remote_ref = provider.submit(image_request("[[POLL_500:1000000]]"))
        with pytest.raises(CollectionPending, match="poll: HTTP 500"):
            provider.collect(remote_ref, deadline_s=0.3, should_stop=never_stop)
        with pytest.raises(CollectionPending, match="poll: HTTP 404"):
            provider.collect("no-such-job", deadline_s=0.1, should_stop=never_stop)


def test_collect_stops_between_waits_when_asked(connect: Callable[..., HttpProvider]) -> None:
    with PredictionsServer(processing_polls=10**9) as server:
        provider = connect(server)
        remote_ref = provider.submit(image_request())
        with pytest.raises(Stopped):
            provider.collect(remote_ref, deadline_s=30, should_stop=lambda: True)


def test_an_output_over_the_size_cap_is_refused_as_pending(
    connect: Callable[..., HttpProvider], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jobs_api, "MAX_IMAGE_BYTES", 16)
    with PredictionsServer() as server:
        provider = connect(server)
        remote_ref = provider.submit(image_request())
        with pytest.raises(CollectionPending, match="refused"):
            provider.collect(remote_ref, deadline_s=10, should_stop=never_stop)


# --- lookup -------------------------------------------------------------------------------


def test_lookup_trusts_the_reply_not_the_filter(connect: Callable[..., HttpProvider]) -> None:
    with PredictionsServer(list_ignores_filter=True) as server:
        provider = connect(server)
        ours = provider.submit(image_request(ref="ref-a"))
        provider.submit(image_request(ref="ref-b"))  # newest: first in the unfiltered list
        assert provider.lookup("ref-a") == ours
        assert provider.lookup("ref-c") is None
        assert provider.lookup("ref-") is None  # exact match only


def test_lookup_follows_same_origin_pages(
    connect: Callable[..., HttpProvider], monkeypatch: pytest.MonkeyPatch
) -> None:
    with PredictionsServer(list_ignores_filter=True, page_size=1) as server:
        provider = connect(server)
        oldest = provider.submit(image_request(ref="ref-0"))
        for n in range(1, 4):
            provider.submit(image_request(ref=f"ref-{n}"))
        assert provider.lookup("ref-0") == oldest  # the last of four pages
        lists = [s for s in server.requests if s.path.startswith("/v1/predictions?")]
        assert len(lists) == 4
        monkeypatch.setattr(lookups, "MAX_LOOKUP_PAGES", 2)
        with pytest.raises(UnknownOutcome, match="more than 2 pages"):
            provider.lookup("ref-0")


def test_two_jobs_carrying_our_reference_are_ambiguous(
    connect: Callable[..., HttpProvider],
) -> None:
    with PredictionsServer(honour_idempotency=False) as server:
        provider = connect(server)
        first = provider.submit(image_request())
        second = provider.submit(image_request())
        assert first != second and server.jobs_made[REF] == 2 and server.bill_micros == 100_000
        with pytest.raises(UnknownOutcome, match="ambiguous"):
            provider.lookup(REF)


def test_a_lookup_that_fails_is_unknown_never_none(connect: Callable[..., HttpProvider]) -> None:
    with PredictionsServer() as server, pytest.raises(UnknownOutcome, match="HTTP 404"):
        connect(server.origin + "/elsewhere").lookup(REF)
    with pytest.raises(UnknownOutcome, match="ConnectError"):
        connect(f"http://127.0.0.1:{free_port()}/v1").lookup(REF)


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        ({"results": [{"client_reference": REF}]}, "no usable id"),
        ({"results": [{"client_reference": REF, "id": "../../admin"}]}, "no usable id"),
        ({"results": "none"}, "results list"),
        ([], "not a JSON object"),
        (b"<html>", "not JSON"),
        ({"results": [], "next": "http://other.example/v1/predictions?page=2"}, "origin"),
        ({"results": [], "next": 7}, "origin"),
    ],
)
def test_a_lookup_reply_we_cannot_read_is_unknown(
    connect: Callable[..., HttpProvider], reply: Any, reason: str
) -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        content = reply if isinstance(reply, bytes) else json.dumps(reply).encode()
        return httpx.Response(200, content=content)

    provider = connect("https://api.example/v1", transport=httpx.MockTransport(answer))
    with pytest.raises(UnknownOutcome, match=reason):
        provider.lookup(REF)
    assert [r.url.host for r in seen] == ["api.example"]


# --- credentials --------------------------------------------------------------------------


@pytest.mark.parametrize("output_host", [True, False])
def test_the_credential_goes_to_the_provider_origin_only(
    connect: Callable[..., HttpProvider], output_host: bool
) -> None:
    with PredictionsServer(output_host=output_host) as server:
        provider = connect(server)
        remote_ref = provider.submit(image_request("[[DOWNLOAD_404:1]]"))
        provider.collect(remote_ref, deadline_s=10, should_stop=never_stop)
        assert provider.lookup(REF) == remote_ref
        downloads = server.files.requests if server.files else []
        api = list(server.requests)
        if server.files:
            assert server.files.origin != server.origin
        else:
            downloads = [s for s in api if s.path.startswith("/v1/files/")]
            api = [s for s in api if not s.path.startswith("/v1/files/")]
        assert len(downloads) == 2  # one 404, one 200
        assert all("authorization" not in seen.headers for seen in downloads)
        assert api and all(s.headers.get("authorization") == f"Bearer {TOKEN}" for s in api)
        assert posts(server) == 1


def test_capabilities_follow_the_profile(connect: Callable[..., HttpProvider]) -> None:
    plain = connect("http://127.0.0.1:9/v1").capabilities
    assert plain.can_lookup and not plain.idempotent_create
    declared = connect("http://127.0.0.1:9/v1", idempotent_create=True, lookup=False).capabilities
    assert declared.idempotent_create and not declared.can_lookup
    assert not BUILTIN["fake"].idempotent_create  # the fake provider declares its own


# --- the fake provider --------------------------------------------------------------------


@pytest.fixture
def fake_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[], list[str]]:
    path = tmp_path / "provider.jsonl"
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(path))

    def events() -> list[str]:
        lines = path.read_text().splitlines() if path.exists() else []
        return [json.loads(line)["event"] for line in lines]

    return events


def fake(tmp_path: Path) -> FakeProvider:
    return FakeProvider(profile_id="fake", state_dir=tmp_path / "fake-state")


def test_the_fake_honours_idempotent_create(
    tmp_path: Path, fake_log: Callable[[], list[str]]
) -> None:
    provider = fake(tmp_path)
    assert provider.capabilities.idempotent_create and provider.capabilities.can_lookup
    first = provider.submit(image_request())
    again = provider.submit(image_request())
    from_another_process = fake(tmp_path).submit(image_request())
    assert first == again == from_another_process == provider.lookup(REF)
    events = fake_log()
    assert events.count("job_created") == 1 and events.count("submit_replayed") == 2
    assert events.count("submit") == 3


def test_a_lost_fake_reply_is_resolved_by_sending_the_same_call(
    tmp_path: Path, fake_log: Callable[[], list[str]]
) -> None:
    provider = fake(tmp_path)
    with pytest.raises(UnknownOutcome):
        provider.submit(image_request("[[LOSE_RESPONSE]]"))
    remote_ref = provider.submit(image_request("[[LOSE_RESPONSE]]"))
    assert provider.lookup(REF) == remote_ref and fake_log().count("job_created") == 1


def test_fake_collect_raises_only_collection_errors(
    tmp_path: Path, fake_log: Callable[[], list[str]]
) -> None:
    provider = fake(tmp_path)
    failing = provider.submit(image_request("[[FAIL_REMOTE]]", ref="ref-f"))
    with pytest.raises(RemoteJobFailed) as caught:
        provider.collect(failing, deadline_s=5, should_stop=never_stop)
    # billed with its compute time reported (2 s, the fake's default), at the fake's price
    assert caught.value.billed and caught.value.compute_us == 2_000_000
    assert provider.capabilities.price.settle(compute_us=2_000_000).amount_micros == 40_000
    for unknown in ("fake-00000000000000000000", "not-a-ref"):
        # "unknown job" proves nothing about a charge: pending, never failed at cost 0
        with pytest.raises(CollectionPending, match=f"job '{unknown}' is unknown"):
            provider.collect(unknown, deadline_s=5, should_stop=never_stop)
    slow = provider.submit(image_request("[[DELAY_MS:60000]]", ref="ref-s"))
    with pytest.raises(CollectionPending):
        provider.collect(slow, deadline_s=0.1, should_stop=never_stop)
    assert fake_log().count("job_created") == 2


def test_the_fake_job_store_is_the_shared_folder_named_absolute_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from episodic.core.errors import ProviderConfigError
    from episodic.providers.fake import jobs_folder

    monkeypatch.delenv("EPISODIC_FAKE_PROVIDER_DIR", raising=False)
    assert jobs_folder(tmp_path) == tmp_path / "fake-provider"
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_DIR", str(tmp_path / "shared"))
    assert jobs_folder(tmp_path / "home") == tmp_path / "shared"
    for relative in ("shared", "./x"):
        monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_DIR", relative)
        with pytest.raises(ProviderConfigError, match="absolute"):
            jobs_folder(tmp_path)


@pytest.mark.parametrize(
    ("marker", "error"),
    [
        ("[[FAIL_TRANSIENT]]", TransientProviderError),
        ("[[FAIL_PERMANENT]]", PermanentProviderError),
    ],
)
def test_fake_refusals_create_nothing(
    tmp_path: Path, fake_log: Callable[[], list[str]], marker: str, error: type[NotCreated]
) -> None:
    provider = fake(tmp_path)
    with pytest.raises(error):
        provider.submit(image_request(marker))
    assert provider.lookup(REF) is None and "job_created" not in fake_log()
