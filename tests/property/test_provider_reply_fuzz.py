"""Malformed provider replies: the HTTP provider against a real local server
(`tests.http_server`) that answers create, poll, lookup and download with fuzzed statuses and
bodies: wrong types, missing fields, NaN/negative/huge costs, non-JSON, huge or deeply nested
bodies, unknown statuses, remote references with control characters or 10 KB long.

Every reply is classified by what it proves (`episodic.providers.base`): `submit` returns a usable
remote reference or raises `NotCreated`/`UnknownOutcome` (a 2xx or 5xx never claims that no
job was made); `collect` returns an image or raises `RemoteJobFailed` (only for a job the
provider says failed) or `CollectionPending`; `lookup` returns None, one usable reference or
raises `UnknownOutcome`. Nothing else escapes, and a cost is always an integer in range.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import episodic.providers.jobs_api as jobs_api
from episodic.core.money import MAX_IMAGE_COST_MICROS
from episodic.core.pricing import MAX_QUANTITY
from episodic.providers.base import (
    CollectionPending,
    ImageRequest,
    ImageResult,
    NotCreated,
    PermanentProviderError,
    RateLimited,
    RemoteJobFailed,
    UnknownOutcome,
)
from episodic.providers.http import HttpProvider
from episodic.providers.profiles import Profile
from tests.http_server import TOKEN, PredictionsServer
from tests.property import fuzz_settings

FUZZ = fuzz_settings(45)
PRICE = 5
REF = "ref-0001"
_USABLE_ID = jobs_api.JOB_ID


def _nested(depth: int) -> Any:
    value: Any = {}
    for _ in range(depth):
        value = {"id": value}
    return value


NASTY_SCALARS: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    1.5,
    10**30,
    -(10**30),
    2**63,
    float("nan"),
    float("inf"),
    "",
    " ",
    "a\x00b",
    "ref\r\nX-Injected: 1",
    "../../admin",
    "x" * 10_000,
    "a" * 257,
    "[bold]x[/]",
    "\u0661\u0662",
    "\u202eevil",
    "job/1",
    "job?x=1",
    "job#1",
    "%2e%2e",
]
# Strings that are never an http URL (no request leaves for a host we did not start).
TEXT = st.text(max_size=30).filter(lambda t: not t.lower().startswith(("http:", "https:")))
SCALAR = st.sampled_from(NASTY_SCALARS) | st.integers() | st.floats() | TEXT
JSON = st.recursive(
    SCALAR,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)
STATUS_WORDS = st.sampled_from(
    ["succeeded", "failed", "canceled", "processing", "starting", "queued", "SUCCEEDED", ""]
) | st.sampled_from(NASTY_SCALARS)
RAW_BODIES = st.sampled_from(
    [
        b"",
        b"<html>created</html>",
        b'{"id": "ok-1"',
        b"\xff\xfe\x00",
        b"[" * 100_000,  # nesting that exhausts a recursive parser
        b'{"id": ' + b"9" * 5000 + b"}",  # an integer past Python's digit limit
        b'{"id": "dup-1", "id": "dup-2"}',
        b'{"cost_micros": NaN, "status": "failed"}',
        b'{"status": "succeeded", "output": ["x"], "cost_micros": 1e999}',
        b" " * 3_000_000 + b"{}",  # a huge body
    ]
)
CODES = st.sampled_from([200, 201, 202, 204, 301, 302, 400, 401, 404, 409, 422, 429, 500, 502])


def job_body(ids: st.SearchStrategy[Any] = SCALAR) -> st.SearchStrategy[Any]:
    """A reply shaped like a job, with every field missing, of the wrong type or nasty."""
    return st.fixed_dictionaries(
        {},
        optional={
            "id": ids,
            "status": STATUS_WORDS,
            "cost_micros": SCALAR,
            "metrics": st.fixed_dictionaries({}, optional={"predict_time": SCALAR}) | SCALAR,
            "output": JSON,
            "client_reference": st.just(REF) | SCALAR,
        },
    )


BODIES = job_body() | JSON | RAW_BODIES


@pytest.fixture(scope="module")
def server() -> Iterator[PredictionsServer]:
    with PredictionsServer(processing_polls=0) as running:
        yield running


@pytest.fixture
def provider(server: PredictionsServer) -> Iterator[Callable[[], HttpProvider]]:
    """A fresh client per example: a malformed reply may leave a pooled connection unusable,
    which would make the next example's well-formed exchange fail."""
    built: list[HttpProvider] = []

    def connect() -> HttpProvider:
        for old in built:
            old.close()
        profile = Profile(
            id="http-fuzz",
            kind="http",
            base_url=server.base_url,
            credential_env="FUZZ_TOKEN",
            cost_per_image_minor=PRICE,
            timeout_s=2.0,
            poll_interval_s=0.01,
        )
        built.append(HttpProvider(profile=profile, token=TOKEN))
        return built[-1]

    yield connect
    for old in built:
        old.close()
    server.reply = None


def replying(
    server: PredictionsServer, kind: str, code: int, body: Any
) -> Callable[[str, str], tuple[int, Any] | None]:
    def reply(asked: str, path: str) -> tuple[int, Any] | None:
        return (code, body) if asked == kind else None

    return reply


def request(prompt: str = "a harbour") -> ImageRequest:
    return ImageRequest(REF, "2026-W32-0", "v01.p1", prompt, 7)


def usable_ref(value: object) -> bool:
    return isinstance(value, str) and _USABLE_ID.fullmatch(value) is not None


def in_range(cost: object) -> bool:
    return type(cost) is int and 0 <= cost <= MAX_IMAGE_COST_MICROS


def measured(compute_us: object) -> bool:
    """A compute time as the adapters hand it on: none, or whole microseconds in range."""
    return compute_us is None or (type(compute_us) is int and 0 <= compute_us <= MAX_QUANTITY)


def sent_body(body: Any) -> Any:
    """What the server put on the wire, as JSON (None if it is not JSON we could read)."""
    if isinstance(body, bytes):
        try:
            return json.loads(body)
        except (ValueError, RecursionError):
            return None
    return json.loads(json.dumps(body))


@FUZZ
@given(code=CODES, body=BODIES)
@example(code=201, body={"id": "x" * 10_000})
@example(code=201, body={"id": "a\x00b"})
@example(code=201, body={"id": "ref\r\nX-Injected: 1"})
@example(code=201, body={"id": 12})
@example(code=201, body=[{"id": "ok"}])
@example(code=201, body=b"[" * 100_000)  # found: RecursionError escaped submit
@example(code=502, body={"id": "ok"})
@example(code=422, body={"detail": "Idempotency-Key reused"})
def test_a_create_reply_is_classified_by_what_it_proves(
    server: PredictionsServer, provider: Callable[[], HttpProvider], code: int, body: Any
) -> None:
    server.reply = None
    client = provider()
    server.reply = replying(server, "create", code, body)
    try:
        remote_ref = client.submit(request())
    except UnknownOutcome:
        return  # always allowed: a job may exist, and we say so
    except NotCreated as exc:  # claims no job was made: only a documented refusal may
        assert 400 <= code < 500 and code != 409, (code, exc)
        if code == 429:
            assert isinstance(exc, RateLimited)
        else:
            assert isinstance(exc, PermanentProviderError)
        assert "\n" not in str(exc) and len(str(exc)) < 200
        return
    assert 200 <= code < 300 and usable_ref(remote_ref), (code, remote_ref)
    assert remote_ref == sent_body(body)["id"]


@FUZZ
@given(code=CODES, body=job_body() | BODIES)
@example(code=200, body={"status": "failed", "cost_micros": 10**30})  # found: stored as is
@example(code=200, body={"status": "failed", "cost_micros": -5})
@example(code=200, body={"status": "failed", "cost_micros": True})
@example(code=200, body={"status": "failed", "cost_micros": 4.0})
@example(code=200, body={"status": "canceled", "cost_micros": float("nan")})
@example(code=200, body={"status": ["failed"]})
@example(code=200, body={"status": "succeeded", "output": "file:///etc/passwd"})
@example(code=200, body={"status": "succeeded", "output": "http://127.0.0.1:1/x.png"})
@example(code=200, body={"status": "succeeded", "output": "http://[::1"})
@example(code=200, body={"status": "succeeded", "output": ["http://127.0.0.1:1/\x00"]})
# found: a host name IDNA cannot encode raised UnicodeError out of collect
@example(code=200, body={"status": "succeeded", "output": "http://" + "a" * 300 + ".invalid"})
@example(code=200, body={"status": "\x1b[31mdone"})
@example(code=200, body=b"[" * 100_000)  # found: RecursionError escaped collect
def test_a_poll_reply_is_classified_and_its_cost_stays_in_range(
    server: PredictionsServer, provider: Callable[[], HttpProvider], code: int, body: Any
) -> None:
    server.reply = None
    client = provider()
    remote_ref = client.submit(request())
    server.reply = replying(server, "poll", code, body)
    try:
        result = client.collect(remote_ref, deadline_s=0.1, should_stop=lambda: False)
    except CollectionPending as exc:
        assert "\x00" not in str(exc)
        return
    except RemoteJobFailed as exc:  # only what the provider says about the job itself
        job = sent_body(body)
        assert 200 <= code < 300 and isinstance(job, dict)
        assert job.get("status") in ("failed", "canceled"), job
        assert exc.billed and measured(exc.compute_us), exc.compute_us
        reported = job.get("cost_micros")
        if in_range(reported) and not isinstance(reported, bool):
            assert exc.reported_micros == reported
        else:  # no figure we believe: the engine charges the profile's price on its basis
            assert exc.reported_micros is None or in_range(exc.reported_micros)
        return
    assert isinstance(result, ImageResult) and result.content
    assert result.reported_micros is None or in_range(result.reported_micros)
    assert measured(result.compute_us), result.compute_us


@settings(FUZZ, max_examples=25)
@given(code=CODES, body=BODIES, cost=SCALAR)
@example(code=200, body=b"", cost=1)
@example(code=200, body=b"x" * 100, cost=10**30)
@example(code=404, body=b"", cost=float("nan"))
def test_a_download_reply_is_pending_or_an_image_with_a_cost_in_range(
    server: PredictionsServer,
    provider: Callable[[], HttpProvider],
    monkeypatch: pytest.MonkeyPatch,
    code: int,
    body: Any,
    cost: Any,
) -> None:
    monkeypatch.setattr(jobs_api, "MAX_IMAGE_BYTES", 1_000_000)
    server.reply = None
    client = provider()
    remote_ref = client.submit(request())
    output = server.output_url(remote_ref)

    def reply(kind: str, path: str) -> tuple[int, Any] | None:
        if kind == "poll":
            return 200, {
                "id": remote_ref,
                "status": "succeeded",
                "output": [output],
                "cost_micros": cost,
            }
        if kind == "file":
            return code, body
        return None

    server.reply = reply
    try:
        result = client.collect(remote_ref, deadline_s=0.1, should_stop=lambda: False)
    except CollectionPending:
        return
    # A 2xx download is returned whatever its body, an empty one too: whether it is an
    # image is the engine's to prove (pipeline.media.prove_image), not the adapter's.
    assert 200 <= code < 300
    assert isinstance(result.content, bytes)
    if in_range(cost) and not isinstance(cost, bool):
        assert result.reported_micros == cost
    else:  # no figure we believe: the engine charges the profile's price on its basis
        assert result.reported_micros is None


@FUZZ
@given(
    code=CODES, body=st.fixed_dictionaries({"results": st.lists(job_body(), max_size=3)}) | BODIES
)
@example(code=200, body={"results": [{"client_reference": REF, "id": "x" * 300}]})
@example(code=200, body={"results": [{"client_reference": REF, "id": "a\nb"}]})
@example(code=200, body={"results": [{"client_reference": [REF], "id": "ok"}]})
@example(code=200, body={"results": [], "next": "//127.0.0.1:1/steal"})
@example(code=200, body={"results": [], "next": "http://[::1"})
@example(code=200, body={"results": [], "next": "http://" + "a" * 300 + ".invalid/p"})
@example(code=200, body={"results": [], "next": {"href": "/v1/predictions"}})
@example(code=200, body=b"[" * 100_000)  # found: RecursionError escaped lookup
def test_a_lookup_reply_is_none_one_usable_reference_or_unknown(
    server: PredictionsServer, provider: Callable[[], HttpProvider], code: int, body: Any
) -> None:
    client = provider()
    server.reply = replying(server, "list", code, body)
    try:
        found = client.lookup(REF)
    except UnknownOutcome:
        return
    assert code == 200
    page = sent_body(body)
    assert isinstance(page, dict) and isinstance(page.get("results"), list)
    ours = {
        entry.get("id")
        for entry in page["results"]
        if isinstance(entry, dict) and entry.get("client_reference") == REF
    }
    if found is None:
        assert not ours
    else:
        assert usable_ref(found) and ours == {found}


def test_the_nan_in_a_reply_is_never_a_cost() -> None:
    assert not in_range(float("nan")) and not in_range(True) and not in_range(math.inf)
