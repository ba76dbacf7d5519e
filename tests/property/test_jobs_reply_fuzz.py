"""Malformed replies to the Replicate and fal adapters, from real local servers that follow
each API's shapes (`tests.jobs_servers`), fuzzed: wrong types, missing fields, non-JSON, huge
or deeply nested bodies, unknown statuses, ids with control characters.

Every reply is classified by what it proves (`providers.base`): `submit` returns a usable id
or raises `NotCreated` (only for a documented refusal: 4xx but 409) or `UnknownOutcome`;
`collect` returns an image or raises `RemoteJobFailed` (only when the provider says the job
failed) or `CollectionPending`; Replicate's `lookup` returns None, one usable id or raises
`UnknownOutcome`. Nothing else escapes, and a cost is always the profile's integer price.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from episodic.providers.base import (
    CollectionPending,
    ImageResult,
    NotCreated,
    OutputGone,
    PermanentProviderError,
    RateLimited,
    RemoteJobFailed,
    UnknownOutcome,
)
from episodic.providers.fal import FalProvider
from episodic.providers.jobs_api import JOB_ID
from episodic.providers.profiles import Profile
from episodic.providers.replicate import ReplicateProvider
from tests.jobs_servers import TOKEN, FalServer, ReplicateServer
from tests.property import fuzz_settings
from tests.property.test_provider_reply_fuzz import (
    BODIES,
    CODES,
    JSON,
    SCALAR,
    measured,
    request,
)

FUZZ = fuzz_settings(30)
PRICE = 7
KINDS = ["replicate", "fal"]
FAL_STATUS = st.fixed_dictionaries(
    {},
    optional={
        "status": st.sampled_from(["IN_QUEUE", "IN_PROGRESS", "COMPLETED", "FAILED", ""]) | SCALAR,
        "error": SCALAR,
        "error_type": SCALAR,
        "metrics": st.fixed_dictionaries({}, optional={"inference_time": SCALAR}) | SCALAR,
    },
)
FAL_RESULT = st.fixed_dictionaries(
    {},
    optional={
        "images": st.lists(st.fixed_dictionaries({}, optional={"url": SCALAR}), max_size=2) | JSON,
        "detail": JSON,
    },
)
REP_PREDICTION = st.fixed_dictionaries(
    {},
    optional={
        "id": SCALAR,
        "status": st.sampled_from(["succeeded", "failed", "canceled", "aborted", "processing"])
        | SCALAR,
        "output": JSON,
        "input": JSON,
        "model": SCALAR,
        "metrics": st.fixed_dictionaries({}, optional={"predict_time": SCALAR}) | SCALAR,
    },
)


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, Any]]:
    with ReplicateServer(processing_polls=0) as rep, FalServer(processing_polls=0) as fal:
        yield {"replicate": rep, "fal": fal}


@pytest.fixture
def connect(servers: dict[str, Any]) -> Iterator[Callable[[str], Any]]:
    built: list[Any] = []

    def build(kind: str) -> Any:
        for old in built:
            old.close()
        server = servers[kind]
        server.reply = None
        model = "owner/model" if kind == "replicate" else "fal-ai/flux/dev"
        profile = Profile(
            id=f"{kind}-fuzz",
            kind=kind,  # type: ignore[arg-type]
            model=model,
            base_url=server.base_url,
            credential_env="FUZZ_TOKEN",
            cost_per_image_minor=PRICE,
            timeout_s=2.0,
            poll_interval_s=0.01,
            lookup_by_input=kind == "replicate",  # the lookup's replies are fuzzed too
        )
        adapter = ReplicateProvider if kind == "replicate" else FalProvider
        built.append(adapter(profile=profile, token=TOKEN))
        return built[-1]

    yield build
    for old in built:
        old.close()
    for server in servers.values():
        server.reply = None


def replying(kind: str, code: int, body: Any) -> Callable[[str, str], tuple[int, Any] | None]:
    return lambda asked, path: (code, body) if asked == kind else None


@FUZZ
@given(kind=st.sampled_from(KINDS), code=CODES, body=BODIES | REP_PREDICTION)
@example(kind="replicate", code=201, body={"id": "a\x00b"})
@example(kind="fal", code=200, body={"request_id": "../x"})
@example(kind="fal", code=409, body={"detail": "conflict"})
@example(kind="replicate", code=201, body=b"[" * 100_000)
def test_a_create_reply_is_classified_by_what_it_proves(
    servers: dict[str, Any], connect: Callable[[str], Any], kind: str, code: int, body: Any
) -> None:
    client = connect(kind)
    servers[kind].reply = replying("create", code, body)
    try:
        remote_ref = client.submit(request())
    except UnknownOutcome:
        return
    except NotCreated as exc:
        assert 400 <= code < 500 and code != 409, (code, exc)
        assert isinstance(exc, RateLimited if code == 429 else PermanentProviderError)
        assert "\n" not in str(exc) and len(str(exc)) < 200
        return
    assert 200 <= code < 300 and JOB_ID.fullmatch(remote_ref), (code, remote_ref)


@FUZZ
@given(kind=st.sampled_from(KINDS), code=CODES, body=BODIES | REP_PREDICTION | FAL_STATUS)
@example(kind="replicate", code=200, body={"status": "succeeded", "output": "file:///etc/passwd"})
@example(kind="replicate", code=200, body={"status": ["failed"]})
@example(kind="fal", code=200, body={"status": "COMPLETED", "error": ""})
@example(kind="fal", code=202, body={"status": "COMPLETED"})
def test_a_poll_reply_is_classified_and_the_cost_is_the_profiles(
    servers: dict[str, Any], connect: Callable[[str], Any], kind: str, code: int, body: Any
) -> None:
    client = connect(kind)
    remote_ref = client.submit(request())
    servers[kind].reply = replying("poll", code, body)
    try:
        result = client.collect(remote_ref, deadline_s=0.1, should_stop=lambda: False)
    except CollectionPending as exc:
        assert "\x00" not in str(exc)
        return
    except RemoteJobFailed as exc:  # only what the provider says about the job itself
        assert 200 <= code < 300 and isinstance(body, dict), (code, body)
        if kind == "replicate":
            assert body.get("status") in ("failed", "canceled", "aborted"), body
        else:
            assert body.get("status") == "COMPLETED" and (
                body.get("error") or body.get("error_type")
            )
        # Replicate bills a failed or canceled prediction (the time it ran), not an aborted
        # one; fal bills successful outputs only
        assert exc.billed == (kind == "replicate" and body.get("status") != "aborted")
        assert measured(exc.compute_us) and exc.reported_micros is None
        return
    assert isinstance(result, ImageResult) and result.content and result.reported_micros is None
    assert measured(result.compute_us), result.compute_us


@settings(FUZZ, max_examples=25)
@given(code=CODES, body=BODIES | FAL_RESULT)
@example(code=422, body={"detail": [{"msg": "nsfw"}]})
@example(code=200, body={"images": [{"url": "http://127.0.0.1:1/x.png"}]})
def test_a_fal_result_reply_is_an_image_a_failure_with_detail_or_pending(
    servers: dict[str, Any], connect: Callable[[str], Any], code: int, body: Any
) -> None:
    client = connect("fal")
    remote_ref = client.submit(request())
    servers["fal"].reply = replying("result", code, body)
    try:
        result = client.collect(remote_ref, deadline_s=0.1, should_stop=lambda: False)
    except CollectionPending:
        return
    except RemoteJobFailed as exc:
        assert code == 422 and isinstance(body, dict) and "detail" in body, (code, body)
        assert not exc.billed  # "You pay only for successful outputs" (fal)
        return
    except OutputGone:  # fal keeps a result an hour: a COMPLETED request's 404, twice
        assert code in (404, 410), (code, body)
        return
    assert isinstance(result, ImageResult) and result.reported_micros is None
    assert measured(result.compute_us), result.compute_us


@settings(FUZZ, max_examples=30)
@given(
    code=CODES,
    body=BODIES
    | st.fixed_dictionaries(
        {"results": st.lists(REP_PREDICTION, max_size=3) | JSON}, optional={"next": SCALAR}
    ),
)
def test_a_replicate_list_reply_is_none_one_usable_id_or_unknown(
    servers: dict[str, Any], connect: Callable[[str], Any], code: int, body: Any
) -> None:
    client = connect("replicate")
    servers["replicate"].reply = replying("list", code, body)
    try:
        found = client.lookup(request().client_reference, request())
    except UnknownOutcome:
        return
    assert found is None or JOB_ID.fullmatch(found)
