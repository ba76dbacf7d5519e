"""The stand-ins of Replicate's and fal's APIs (tests/standins) answer as those providers
document, and today's adapters, built through `build_client` with a profile whose ``base_url``
is the stand-in, submit, collect, cancel and look up against them. Money is read from the
stand-in's own bill."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image
from sqlalchemy import Engine, func, select

from episodic.core.exit_codes import ExitCode
from episodic.providers.adapters import build_client
from episodic.providers.base import CannotCheck, ImageRequest, RemoteJobFailed, UnknownOutcome
from episodic.providers.profiles import Profile
from episodic.storage.models import CostEntryRow
from tests.generation import new_episode, write_playlist
from tests.standins import FalStandIn, ReplicateStandIn
from tests.standins import fal as fal_standin
from tests.standins import replicate as replicate_standin

SCHNELL = "/models/black-forest-labs/flux-schnell/predictions"
REQUEST = ImageRequest("ref-1", "2026-W32-1", "v01", "a red fox", 1234)


@pytest.fixture
def replicate() -> Iterator[ReplicateStandIn]:
    with ReplicateStandIn() as server:
        yield server


@pytest.fixture
def fal() -> Iterator[FalStandIn]:
    with FalStandIn() as server:
        yield server


def replicate_api(server: ReplicateStandIn, token: str = replicate_standin.TOKEN) -> httpx.Client:
    return httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {token}"})


def fal_api(server: FalStandIn, token: str = fal_standin.TOKEN) -> httpx.Client:
    return httpx.Client(base_url=server.base_url, headers={"Authorization": f"Key {token}"})


def create(api: httpx.Client, prompt: str = "a fox", **inputs: Any) -> httpx.Response:
    return api.post(SCHNELL, json={"input": {"prompt": prompt, **inputs}})


# ---------------------------------------------------------------- Replicate, the stand-in
def test_replicate_prediction_runs_starting_processing_succeeded_with_outputs_on_delivery(
    replicate: ReplicateStandIn,
) -> None:
    api = replicate_api(replicate)
    created = create(api, num_outputs=2, aspect_ratio="16:9")
    assert created.status_code == 201 and created.json()["status"] == "starting"
    prediction_id = created.json()["id"]
    statuses = [api.get(f"/predictions/{prediction_id}").json() for _ in range(2)]
    assert [s["status"] for s in statuses] == ["processing", "succeeded"]
    done = statuses[-1]
    assert done["metrics"]["predict_time"] == replicate_standin.DEFAULT_PREDICT_TIME
    assert done["data_removed"] is False and done["error"] is None
    assert done["urls"]["get"].endswith(f"/predictions/{prediction_id}")
    outputs = done["output"]
    assert len(outputs) == 2
    assert all(url.startswith(replicate.delivery.origin) for url in outputs)
    assert not outputs[0].startswith(replicate.api.origin)  # another origin
    picture = httpx.get(outputs[0])
    assert picture.status_code == 200 and picture.headers["content-type"] == "image/png"
    assert Image.open(io.BytesIO(picture.content)).size == (1344, 768)
    assert not replicate.credential_reached_delivery
    assert replicate.jobs_made == {"a fox": 1}
    assert replicate.bill_micros == 2 * 3_000  # per output image


def test_replicate_prefer_wait_holds_the_create_until_the_prediction_ends(
    replicate: ReplicateStandIn,
) -> None:
    api = replicate_api(replicate)
    held = api.post(SCHNELL, json={"input": {"prompt": "now"}}, headers={"Prefer": "wait"})
    assert held.status_code == 201
    assert held.json()["status"] == "succeeded" and held.json()["output"]
    # a prediction still running when the wait is over is answered as it stands
    replicate.script("long", polls=None)
    running = api.post(SCHNELL, json={"input": {"prompt": "long"}}, headers={"Prefer": "wait=5"})
    assert running.json()["status"] == "processing" and running.json()["output"] is None
    async_mode = create(api, "later")
    assert async_mode.json()["status"] == "starting"


def test_replicate_refusals_are_problem_documents_and_make_nothing() -> None:
    with ReplicateStandIn(credit_micros=3_000) as server:
        unauthenticated = create(replicate_api(server, token="wrong"))
        assert unauthenticated.status_code == 401
        assert unauthenticated.headers["content-type"] == "application/problem+json"
        assert set(unauthenticated.json()) == {"title", "detail", "status"}
        api = replicate_api(server)
        invalid = create(api, num_outputs=9)
        assert invalid.status_code == 422
        assert "input.num_outputs" in invalid.json()["detail"]
        server.throttle(1, retry_after=1)
        throttled = create(api)
        assert throttled.status_code == 429 and throttled.headers["retry-after"] == "1"
        assert throttled.json()["detail"] == (
            "Request was throttled. Expected available in 1 second."
        )
        server.unavailable(1, retry_after=7)
        unavailable = create(api)
        assert unavailable.status_code == 503 and unavailable.headers["retry-after"] == "7"
        assert server.jobs_made_total == 0
        paid = create(api, prompt="paid").json()["id"]
        server.finish(paid)
        assert server.bill_micros == 3_000  # the credit is spent
        no_credit = create(api, prompt="more")
        assert no_credit.status_code == 402
        assert no_credit.json()["status"] == 402 and no_credit.json()["title"]
        assert server.jobs_made_total == 1


def test_replicate_removes_output_input_and_files_after_the_retention_window(
    replicate: ReplicateStandIn,
) -> None:
    api = replicate_api(replicate)
    held = api.post(SCHNELL, json={"input": {"prompt": "kept"}}, headers={"Prefer": "wait"})
    prediction_id, url = held.json()["id"], held.json()["output"][0]
    replicate.advance(3599)
    assert httpx.get(url).status_code == 200
    assert api.get(f"/predictions/{prediction_id}").json()["data_removed"] is False
    replicate.advance(2)
    gone = api.get(f"/predictions/{prediction_id}").json()
    assert gone["data_removed"] is True and gone["output"] is None and gone["input"] == {}
    assert gone["status"] == "succeeded"
    assert httpx.get(url).status_code == 404
    assert replicate.bill_micros == 3_000  # what was billed stays billed


def test_replicate_official_models_bill_per_output_image_never_a_failed_or_canceled_one(
    replicate: ReplicateStandIn,
) -> None:
    api = replicate_api(replicate)
    replicate.script("oom", status="failed", error="CUDA out of memory", logs="step 1\n")
    replicate.script("slow", polls=None)
    ok = create(api, "fine", num_outputs=3).json()["id"]
    failed = create(api, "oom").json()["id"]
    slow = create(api, "slow").json()["id"]
    for prediction_id in (ok, ok, failed, failed, slow):
        api.get(f"/predictions/{prediction_id}")
    failure = api.get(f"/predictions/{failed}").json()
    assert failure["status"] == "failed" and failure["error"] == "CUDA out of memory"
    assert failure["logs"] == "step 1\n" and failure["output"] is None
    canceled = api.post(f"/predictions/{slow}/cancel").json()
    assert canceled["status"] == "canceled" and replicate.cancels[slow] == 1
    assert replicate.bills == {ok: 3 * 3_000}


def test_replicate_hardware_models_bill_predict_time_also_when_failed_or_canceled() -> None:
    with ReplicateStandIn(billing="per_second", price_micros=1_400) as server:
        api = replicate_api(server)
        server.script("oom", status="failed", error="CUDA out of memory", predict_time=1.5)
        server.script("slow", polls=None, predict_time=0.25)
        server.script("never", status="aborted", polls=0)
        ok, failed, slow, never = (
            create(api, p).json()["id"] for p in ("a", "oom", "slow", "never")
        )
        for prediction_id in (ok, ok, failed, failed, slow, never):
            api.get(f"/predictions/{prediction_id}")
        assert api.get(f"/predictions/{never}").json()["status"] == "aborted"
        api.post(f"/predictions/{slow}/cancel")
        assert server.bills == {
            ok: 3_926,  # 1400 x 2.803618 = 3925.0652, rounded up
            failed: 2_100,
            slow: 350,
        }
        assert server.bill_micros == 3_926 + 2_100 + 350


def test_replicate_lists_predictions_newest_first_with_a_next_cursor() -> None:
    with ReplicateStandIn(page_size=2) as server:
        api = replicate_api(server)
        made = [create(api, f"p{n}").json()["id"] for n in range(5)]
        first = api.get("/predictions").json()
        assert [p["id"] for p in first["results"]] == made[:-3:-1]
        second = httpx.get(first["next"], headers=api.headers).json()
        assert [p["id"] for p in second["results"]] == [made[2], made[1]]
        third = httpx.get(second["next"], headers=api.headers).json()
        assert [p["id"] for p in third["results"]] == [made[0]] and third["next"] is None


def test_replicate_account_model_and_version_carry_the_input_schema(
    replicate: ReplicateStandIn,
) -> None:
    api = replicate_api(replicate)
    assert api.get("/account").json()["username"] == "standin"
    model = api.get("/models/black-forest-labs/flux-schnell").json()
    properties = model["latest_version"]["openapi_schema"]["components"]["schemas"]["Input"]
    assert "num_outputs" in properties["properties"]
    version = model["latest_version"]["id"]
    assert api.get(f"/models/black-forest-labs/flux-schnell/versions/{version}").status_code == 200
    assert api.get("/models/nobody/nothing").status_code == 404


@pytest.mark.parametrize("kind", ["replicate", "fal"])
def test_a_lost_reply_or_a_dropped_connection_after_create_still_makes_the_job(kind: str) -> None:
    server: ReplicateStandIn | FalStandIn
    with ReplicateStandIn() if kind == "replicate" else FalStandIn() as server:  # type: ignore[attr-defined]
        if isinstance(server, ReplicateStandIn):
            api = replicate_api(server)

            def send() -> httpx.Response:
                return create(api, "lost")
        else:
            api = fal_api(server)

            def send() -> httpx.Response:
                return api.post("/fal-ai/flux/dev", json={"prompt": "lost"})

        server.lose_reply(1)
        server.drop_after_create(1)
        assert send().status_code == 500
        with pytest.raises(httpx.TransportError):
            send()
        assert send().status_code in (200, 201)
        assert server.jobs_made == {"lost": 3} and server.create_calls == 3
        assert len(server.create_requests) == 3


def test_armed_refusals_and_read_throttles_answer_with_the_providers_documented_bodies() -> None:
    with ReplicateStandIn() as replicate, FalStandIn() as fal:
        rapi, fapi = replicate_api(replicate), fal_api(fal)
        replicate.refuse(1, 402)
        fal.refuse(1, 403)
        no_credit = create(rapi)
        assert no_credit.status_code == 402 and no_credit.json()["title"] == "Insufficient credit"
        locked = fapi.post("/fal-ai/flux/dev", json={"prompt": "x"})
        assert locked.status_code == 403 and "locked" in locked.json()["detail"]
        assert replicate.jobs_made_total == 0 and fal.jobs_made_total == 0
        prediction_id = create(rapi).json()["id"]
        request_id = fapi.post("/fal-ai/flux/dev", json={"prompt": "x"}).json()["request_id"]
        replicate.throttle_reads(1, retry_after=3)
        fal.throttle_reads(1, retry_after=4, status=503)
        read = rapi.get(f"/predictions/{prediction_id}")
        assert read.status_code == 429 and read.headers["retry-after"] == "3"
        status = fapi.get(f"/fal-ai/flux/requests/{request_id}/status")
        assert status.status_code == 503 and status.headers["retry-after"] == "4"
        assert rapi.get(f"/predictions/{prediction_id}").status_code == 200
        assert fapi.get(f"/fal-ai/flux/requests/{request_id}/status").status_code == 202


# ---------------------------------------------------------------- fal, the stand-in
def test_fal_request_goes_in_queue_in_progress_completed_with_its_inference_time(
    fal: FalStandIn,
) -> None:
    api = fal_api(fal)
    submitted = api.post("/fal-ai/flux/dev", json={"prompt": "fox", "seed": 3})
    assert submitted.status_code == 200
    body = submitted.json()
    request_id = body["request_id"]
    assert body["status_url"].endswith(f"/fal-ai/flux/requests/{request_id}/status")
    assert "/flux/dev/" not in body["response_url"]  # owner and app only
    early = api.get(f"/fal-ai/flux/requests/{request_id}")
    assert early.status_code == 400 and "detail" in early.json()
    statuses = [api.get(f"/fal-ai/flux/requests/{request_id}/status") for _ in range(3)]
    assert [(s.status_code, s.json()["status"]) for s in statuses] == [
        (202, "IN_QUEUE"),
        (202, "IN_PROGRESS"),
        (200, "COMPLETED"),
    ]
    assert "queue_position" in statuses[0].json()
    assert statuses[-1].json()["metrics"] == {"inference_time": fal_standin.DEFAULT_INFERENCE_TIME}
    result = api.get(f"/fal-ai/flux/requests/{request_id}").json()
    (image,) = result["images"]
    assert (image["width"], image["height"]) == (1024, 768)  # landscape_4_3, the default
    assert image["content_type"] == "image/png" and image["url"].startswith(fal.delivery.origin)
    assert httpx.get(image["url"]).status_code == 200
    assert api.get(f"/fal-ai/flux/dev/requests/{request_id}/status").status_code == 404
    assert not fal.credential_reached_delivery


@pytest.mark.parametrize(
    ("image_size", "size", "megapixels"),
    [
        ("square_hd", (1024, 1024), 2),  # 1,048,576 pixels: two started megapixels
        ("square", (512, 512), 1),
        ("portrait_4_3", (768, 1024), 1),
        ("portrait_16_9", (576, 1024), 1),
        ("landscape_4_3", (1024, 768), 1),
        ("landscape_16_9", (1024, 576), 1),
        ({"width": 2000, "height": 1000}, (2000, 1000), 2),
        ({"width": 2000, "height": 1001}, (2000, 1001), 3),
    ],
)
def test_fal_image_size_presets_and_billing_by_started_megapixel(
    fal: FalStandIn, image_size: object, size: tuple[int, int], megapixels: int
) -> None:
    api = fal_api(fal)
    request_id = api.post(
        "/fal-ai/flux/dev", json={"prompt": "x", "image_size": image_size}
    ).json()["request_id"]
    fal.finish(request_id)
    (image,) = api.get(f"/fal-ai/flux/requests/{request_id}").json()["images"]
    assert (image["width"], image["height"]) == size
    assert fal.bills == {request_id: megapixels * 25_000}


def test_fal_failures_are_not_billed_and_carry_the_error(fal: FalStandIn) -> None:
    api = fal_api(fal)
    fal.script("oom", error="CUDA out of memory", error_type="runner_server_error")
    failed = api.post("/fal-ai/flux/dev", json={"prompt": "oom"}).json()["request_id"]
    bad = api.post("/fal-ai/flux/dev", json={"prompt": "x", "image_size": "huge"}).json()
    fal.finish(failed)
    status = api.get(f"/fal-ai/flux/requests/{failed}/status").json()
    assert status["status"] == "COMPLETED" and status["error"] == "CUDA out of memory"
    assert status["error_type"] == "runner_server_error"
    result = api.get(f"/fal-ai/flux/requests/{failed}")
    assert result.status_code == 500 and result.json()["detail"] == "CUDA out of memory"
    assert result.headers["x-fal-error-type"] == "runner_server_error"
    assert api.get(f"/fal-ai/flux/requests/{bad['request_id']}/status").json()["error"]
    invalid = api.get(f"/fal-ai/flux/requests/{bad['request_id']}")
    assert invalid.status_code == 422 and invalid.json()["detail"][0]["loc"] == [
        "body",
        "image_size",
    ]
    assert fal.bill_micros == 0 and fal.jobs_made_total == 2


def test_fal_errors_are_detail_bodies() -> None:
    with FalStandIn(credit_micros=25_000) as server:
        assert (
            fal_api(server, "wrong").post("/fal-ai/flux/dev", json={"prompt": "x"}).status_code
            == 401
        )
        api = fal_api(server)
        unknown = api.post("/fal-ai/nothing", json={"prompt": "x"})
        assert unknown.status_code == 404 and "detail" in unknown.json()
        server.throttle(1, retry_after=2)
        throttled = api.post("/fal-ai/flux/dev", json={"prompt": "x"})
        assert throttled.status_code == 429 and throttled.headers["retry-after"] == "2"
        server.finish(api.post("/fal-ai/flux/dev", json={"prompt": "x"}).json()["request_id"])
        locked = api.post("/fal-ai/flux/dev", json={"prompt": "y"})
        assert locked.status_code == 403 and "Exhausted balance" in locked.json()["detail"]
        assert server.jobs_made_total == 1


def test_fal_cancel_answers_by_where_the_request_is(fal: FalStandIn) -> None:
    api = fal_api(fal)
    fal.script("slow", polls=None)
    queued = api.post("/fal-ai/flux/dev", json={"prompt": "slow"}).json()["request_id"]
    done = api.post("/fal-ai/flux/dev", json={"prompt": "done"}).json()["request_id"]
    fal.finish(done)
    cancelled = api.put(f"/fal-ai/flux/requests/{queued}/cancel")
    assert (cancelled.status_code, cancelled.json()) == (202, {"status": "CANCELLATION_REQUESTED"})
    assert api.get(f"/fal-ai/flux/requests/{queued}/status").json()["status"] == "COMPLETED"
    finished = api.put(f"/fal-ai/flux/requests/{done}/cancel")
    assert (finished.status_code, finished.json()) == (400, {"status": "ALREADY_COMPLETED"})
    missing = api.put("/fal-ai/flux/requests/00000000-0000-0000-0000-000000000000/cancel")
    assert (missing.status_code, missing.json()) == (404, {"status": "NOT_FOUND"})
    fal.script("stubborn", queue_polls=0, polls=None, stops_on_cancel=False)
    stubborn = api.post("/fal-ai/flux/dev", json={"prompt": "stubborn"}).json()["request_id"]
    assert api.get(f"/fal-ai/flux/requests/{stubborn}/status").json()["status"] == "IN_PROGRESS"
    assert api.put(f"/fal-ai/flux/requests/{stubborn}/cancel").status_code == 202
    assert api.get(f"/fal-ai/flux/requests/{stubborn}/status").json()["status"] == "IN_PROGRESS"
    fal.finish(stubborn)  # the app went on: it completes, and is billed
    assert "error" not in api.get(f"/fal-ai/flux/requests/{stubborn}/status").json()
    assert fal.bills.keys() == {done, stubborn}


def test_fal_media_expires_as_the_request_asked_and_payloads_after_thirty_days(
    fal: FalStandIn,
) -> None:
    api = fal_api(fal)
    lifecycle = {
        "X-Fal-Object-Lifecycle-Preference": json.dumps({"expiration_duration_seconds": 600})
    }
    short = api.post("/fal-ai/flux/dev", json={"prompt": "a"}, headers=lifecycle).json()
    kept = api.post("/fal-ai/flux/dev", json={"prompt": "b"}).json()
    for submitted in (short, kept):
        fal.finish(submitted["request_id"])
    urls = [api.get(s["response_url"]).json()["images"][0]["url"] for s in (short, kept)]
    fal.advance(601)
    assert [httpx.get(url).status_code for url in urls] == [404, 200]
    fal.advance(30 * 24 * 3600)
    assert api.get(kept["status_url"]).status_code == 404


# ---------------------------------------------------------------- today's adapters
def replicate_profile(server: ReplicateStandIn, **fields: Any) -> Profile:
    values: dict[str, Any] = {
        "id": "rep",
        "kind": "replicate",
        "model": replicate_standin.OFFICIAL_MODEL,
        "base_url": server.base_url,
        "credential_env": "REPLICATE_API_TOKEN",
        "price": {"per_image": "0.003"},
        "inputs": {"num_outputs": 1, "aspect_ratio": "1:1"},
        "timeout_s": 5.0,
        "poll_interval_s": 0.02,
        "lookup_by_input": True,
    }
    return Profile(**(values | fields))


def fal_profile(server: FalStandIn, **fields: Any) -> Profile:
    values: dict[str, Any] = {
        "id": "falp",
        "kind": "fal",
        "model": fal_standin.MODEL,
        "base_url": server.base_url,
        "schema_url": server.schema_url,
        "credential_env": "FAL_KEY",
        "price": {"per_megapixel": "0.025", "at_most": "2"},
        "inputs": {"image_size": "landscape_4_3", "num_images": 1},
        "timeout_s": 5.0,
        "poll_interval_s": 0.02,
    }
    return Profile(**(values | fields))


def never_stop() -> bool:
    return False


def test_the_replicate_adapter_submits_collects_cancels_and_looks_up(
    replicate: ReplicateStandIn, tmp_path: Path
) -> None:
    provider = build_client(replicate_profile(replicate), replicate_standin.TOKEN, tmp_path)
    prediction_id = provider.submit(REQUEST)
    assert replicate.predictions[prediction_id].input == {
        "num_outputs": 1,
        "aspect_ratio": "1:1",
        "prompt": "a red fox",
        "seed": 1234,
    }
    result = provider.collect(prediction_id, deadline_s=10, should_stop=never_stop)
    assert result.content.startswith(b"\x89PNG")
    assert result.compute_us == 2_803_618
    assert provider.lookup(REQUEST.client_reference, REQUEST) == prediction_id
    replicate.script("slow", polls=None)
    slow = provider.submit(ImageRequest("ref-2", "2026-W32-1", "v02", "slow fox", 7))
    assert provider.cancel(slow) == "canceled"  # type: ignore[attr-defined]
    assert "Replicate accepted the token" in provider.check()  # type: ignore[attr-defined]
    assert replicate.jobs_made == {"a red fox": 1, "slow fox": 1}
    assert replicate.bill_micros == 3_000  # one output image; the canceled one bills nothing
    assert not replicate.credential_reached_delivery


def test_the_replicate_adapter_with_a_pinned_version_creates_on_predictions(
    replicate: ReplicateStandIn, tmp_path: Path
) -> None:
    version = replicate.version_id(replicate_standin.OFFICIAL_MODEL)
    provider = build_client(
        replicate_profile(replicate, version=version), replicate_standin.TOKEN, tmp_path
    )
    prediction_id = provider.submit(REQUEST)
    assert replicate.requests[-1].path == "/v1/predictions"
    assert replicate.predictions[prediction_id].version == version
    assert provider.collect(prediction_id, deadline_s=10, should_stop=never_stop).content


def test_the_replicate_adapter_reads_a_failed_prediction_as_failed(
    replicate: ReplicateStandIn, tmp_path: Path
) -> None:
    provider = build_client(replicate_profile(replicate), replicate_standin.TOKEN, tmp_path)
    replicate.script("oom", status="failed", error="CUDA out of memory")
    failed = provider.submit(ImageRequest("ref-3", "2026-W32-1", "v03", "oom fox", 3))
    with pytest.raises(RemoteJobFailed):
        provider.collect(failed, deadline_s=10, should_stop=never_stop)
    assert replicate.bill_micros == 0


def test_the_fal_adapter_submits_collects_and_cancels(fal: FalStandIn, tmp_path: Path) -> None:
    provider = build_client(fal_profile(fal), fal_standin.TOKEN, tmp_path)
    request_id = provider.submit(REQUEST)
    submit = fal.requests[0]
    assert submit.path == "/fal-ai/flux/dev"
    assert submit.headers["authorization"] == f"Key {fal_standin.TOKEN}"
    assert fal.fal_requests[request_id].input == {
        "image_size": "landscape_4_3",
        "num_images": 1,
        "prompt": "a red fox",
        "seed": 1234,
    }
    result = provider.collect(request_id, deadline_s=10, should_stop=never_stop)
    assert result.content.startswith(b"\x89PNG")
    assert result.compute_us == 1_873_000
    fal.script("slow", polls=None)
    slow = provider.submit(ImageRequest("ref-2", "2026-W32-1", "v02", "slow fox", 7))
    assert provider.cancel(slow) == "CANCELLATION_REQUESTED"  # type: ignore[attr-defined]
    with pytest.raises(UnknownOutcome):  # fal's queue has no way to find a request
        provider.lookup(REQUEST.client_reference, REQUEST)
    with pytest.raises(CannotCheck):
        provider.check()  # type: ignore[attr-defined]
    assert fal.jobs_made == {"a red fox": 1, "slow fox": 1}
    assert fal.bill_micros == 25_000  # 1024x768: one started megapixel; cancelled: nothing
    assert not fal.credential_reached_delivery


# ---------------------------------------------------------------- a run through the engine
@pytest.mark.parametrize("kind", ["replicate", "fal"])
def test_a_run_buys_each_item_once_and_the_ledger_equals_the_stand_ins_bill(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    server: ReplicateStandIn | FalStandIn
    if kind == "replicate":
        server, token = ReplicateStandIn(), replicate_standin.TOKEN
        profile = (
            f"    model: {replicate_standin.OFFICIAL_MODEL}\n"
            '    price: {per_image: "0.003"}\n'
            "    inputs: {num_outputs: 1}\n"
        )
    else:
        server, token = FalStandIn(), fal_standin.TOKEN
        profile = (
            f"    model: {fal_standin.MODEL}\n"
            f"    schema_url: {server.schema_url}\n"
            '    price: {per_megapixel: "0.025", whole_megapixels: true, at_most: "2"}\n'
            "    inputs: {image_size: landscape_4_3}\n"
        )
    with server:
        (tmp_path / "providers.yaml").write_text(
            f"profiles:\n  real:\n    kind: {kind}\n    base_url: {server.base_url}\n"
            "    credential_env: IMAGE_KEY\n    timeout_s: 5.0\n    poll_interval_s: 0.02\n"
            + profile
        )
        monkeypatch.setenv("EPISODIC_PROVIDERS_FILE", str(tmp_path / "providers.yaml"))
        monkeypatch.setenv("IMAGE_KEY", token)
        episode = new_episode(engine)
        episode.plan(write_playlist(tmp_path / "pl", ["a", "b"], profile="real"))
        outcome = episode.generate()
        assert outcome.exit_code == ExitCode.OK, outcome.message
        assert server.jobs_made_total == 2 and set(server.jobs_made.values()) == {1}
        with engine.connect() as conn:
            ledger = conn.execute(select(func.sum(CostEntryRow.amount_micros))).scalar_one()
        assert ledger == server.bill_micros == 2 * (3_000 if kind == "replicate" else 25_000)
        assert not server.credential_reached_delivery
