"""Real local HTTP servers that follow Replicate's and fal's documented request and response
shapes (paths, auth headers, status names, pagination), with fault injection, for the
adapters' tests. Outputs are served from a second origin (127.0.0.2 where bindable) that
records whether a credential ever reached it.

``ReplicateServer``: ``POST /v1/models/{owner}/{name}/predictions`` and ``POST /v1/predictions``
(with ``version``), ``GET /v1/predictions/{id}``, ``GET /v1/predictions`` (newest first,
``created_after``/``created_before``, ``next`` as an absolute URL with a cursor),
``POST /v1/predictions/{id}/cancel``, ``GET /v1/account``, ``GET /v1/models/{owner}/{name}``
(``latest_version.openapi_schema``) and ``.../versions/{id}`` (``models``, ``versions``: the
known ones and their ``components.schemas.Input.properties``; 404 otherwise);
``Authorization: Bearer TOKEN``.
A prediction is ``starting``, then ``processing``, then ``succeeded`` with ``output`` a list
of URLs (``output_as_string``: one URL).

``FalServer``: ``POST /{owner}/{app}[/{subpath}]`` (the input as the body), ``GET
/{owner}/{app}/requests/{id}/status`` (202 ``IN_QUEUE``, 202 ``IN_PROGRESS``, 200
``COMPLETED``), ``GET /{owner}/{app}/requests/{id}`` (``images: [{url, ...}]``), ``PUT
.../cancel``; ``Authorization: Key TOKEN``; on the files origin (public, no key) the
endpoint's OpenAPI document ``/api/openapi/queue/openapi.json?endpoint_id=`` (``schema_url``;
``POST /{endpoint}``'s body a ``$ref`` to its input schema; 404 for an unknown endpoint).
Request URLs with the subpath answer 404, as the adapter must drop it.

Markers in the prompt, ``:n`` for the first n calls of that prompt and seed (default 1):
``[[HTTP_429:n]]``, ``[[REFUSE_422:n]]``, ``[[HTTP_401:n]]``, ``[[HTTP_402:n]]`` (refused,
nothing made: a problem document ``{title, status, detail}``, or ``problems[code]`` when set,
as Replicate answers an account without credit);
``[[CREATED_502:n]]`` (made, then 502), ``[[ACCEPT_DROP:n]]`` (made, connection closed);
``[[REMOTE_FAIL]]`` (the job fails, with ``failure_text`` as its ``error``),
``[[ABORTED]]`` (Replicate: aborted before it started), ``[[RESULT_422]]`` (fal: the request
completes, and its result answers 422 with a validation ``detail``, as `providers.fal` reads
the queue's result: the model refused the input after the queue took it).
``jobs_made`` counts jobs per (prompt, seed): what the provider would bill.
``lose_creates = n``: the next n creates (any prompt) are answered 502 by a gateway before
they reach the API: nothing is made, and the client cannot tell (an unknown outcome).

``output_format``: the outputs are served as ``png`` (default), ``webp`` (Replicate's own
default), ``jpeg`` (fal's), or ``html``, ``truncated``, ``gif`` (`providers.fake.render_output`).

Measurements, as the real APIs put them in their replies: every output is a picture of a real
size (``size=(w, h)``; default Replicate 1024x1024, flux-schnell's 1:1 at one megapixel; fal
the request's ``image_size`` preset or ``{width, height}``, default ``landscape_4_3`` =
1024x768, as fal documents, and its result lists ``images[].width/height``); each job reports
its compute time in seconds (``compute_s``, or ``[[COMPUTE_MS:n]]`` in the prompt; and
``[[SIZE:WxH]]`` sets one output's size): Replicate
``metrics.predict_time`` on every terminal prediction, fal ``metrics.inference_time`` in the
COMPLETED status. The server keeps its **own bill** in micro-units (``bill_micros``, per job
in ``bills``), by the provider's rule (`billing`, at ``price_micros`` per unit), with Decimal
arithmetic of its own, rounded up to a micro-unit: ``per_image`` (Replicate's official
models: per output image), ``per_second`` (Replicate's time-billed models: the prediction's
``predict_time``, also when it failed or was canceled), ``per_megapixel`` (exact) or
``per_whole_megapixel`` (fal: every started megapixel of the output; a failed request is
never billed, fal's rule, and neither is a job whose output was never made).

Retention, on a stand-in clock (``clock``, seconds, moved only by the test: ``pass_time(s)``):
with ``retention_s`` set, a job made ``retention_s`` or more before ``clock`` has lost its
output, as the providers document it: its file answers 404, and with ``removal =
"data_removed"`` (the default) Replicate's prediction reads ``output: null, data_removed:
true`` and fal's result answers 404; with ``removal = "delivery"`` only the file is gone.

Throttles (Replicate's documented 429: ``{"detail": "Request was throttled. ..."}`` with
``Retry-After``): ``throttle_creates = n`` answers the next n creates 429 with ``Retry-After:
retry_after`` (nothing made); ``throttle_window_s = s`` answers every create 429 for s seconds
(real time) from the first create after it was set, with the seconds left as ``Retry-After``;
``throttle_polls = n`` answers the next n polls 429. ``create_log``: (``time.monotonic()``,
status) of every create request, in order.

``reply`` (for fuzzing): a callable ``(kind, path) -> (status, body) | None`` asked before each
answer (kind: ``create``, ``poll``, ``result`` (fal), ``list``); a non-None answer is sent
instead (``bytes`` as they are, anything else as JSON). A create it answers still makes the job.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import re
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import ROUND_CEILING, Decimal
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlencode, urlparse

from episodic.providers.fake import render_output
from tests.http_server import Seen, _hits, _QuietServer, _second_loopback

TOKEN = "jobs-token-not-a-secret"
FAL_SIZES = {  # fal's image_size presets (docs.fal.ai, model arguments)
    "square_hd": (1024, 1024),
    "square": (512, 512),
    "portrait_4_3": (768, 1024),
    "portrait_16_9": (576, 1024),
    "landscape_4_3": (1024, 768),
    "landscape_16_9": (1024, 576),
}
DEFAULT_COMPUTE_S = 2.803618  # a predict_time from Replicate's own cassettes
_COMPUTE = re.compile(r"\[\[COMPUTE_MS:([0-9]{1,9})\]\]")
_SIZE = re.compile(r"\[\[SIZE:([0-9]{1,4})x([0-9]{1,4})\]\]")
BILLINGS = ("per_image", "per_second", "per_megapixel", "per_whole_megapixel")
# The input properties of the models' published schemas (names as Replicate's
# black-forest-labs/flux-schnell and fal's fal-ai/flux/dev list them; types abridged)
REPLICATE_INPUTS = {
    name: {"type": kind, "title": name.replace("_", " ").title(), "x-order": order}
    for order, (name, kind) in enumerate(
        [
            ("prompt", "string"),
            ("seed", "integer"),
            ("go_fast", "boolean"),
            ("megapixels", "string"),
            ("num_outputs", "integer"),
            ("aspect_ratio", "string"),
            ("output_format", "string"),
            ("output_quality", "integer"),
            ("num_inference_steps", "integer"),
            ("disable_safety_checker", "boolean"),
            ("image", "string"),
        ]
    )
}
FAL_INPUTS = {
    name: {"type": kind, "title": name.replace("_", " ").title()}
    for name, kind in [
        ("prompt", "string"),
        ("image_size", "string"),
        ("num_inference_steps", "integer"),
        ("seed", "integer"),
        ("guidance_scale", "number"),
        ("sync_mode", "boolean"),
        ("num_images", "integer"),
        ("enable_safety_checker", "boolean"),
        ("output_format", "string"),
        ("acceleration", "string"),
    ]
}
OPENAPI_PATH = "/api/openapi/queue/openapi.json"


@functools.lru_cache(maxsize=64)
def render_picture(prompt: str, seed: int, width: int, height: int, kind: str = "png") -> bytes:
    """A deterministic `width` x `height` picture of (prompt, seed), as PNG, WEBP or JPEG."""
    from PIL import Image

    digest = hashlib.sha256(f"{seed}\x00{prompt}".encode()).digest()
    tile = Image.frombytes("RGB", (8, 8), (digest * 6)[: 8 * 8 * 3])
    image = Image.new("RGB", (width, height), tuple(digest[:3]))
    image.paste(tile.resize((width // 2, height // 2)), (width // 4, height // 4))
    out = io.BytesIO()
    image.save(out, format=kind.upper())
    return out.getvalue()


def provider_bill(billing: str, price_micros: int, *, pixels: int, compute_s: float) -> int:
    """What the provider charges for one job by its own rule, in micro-units: Decimal
    arithmetic on the figures its reply shows, rounded up to a whole micro-unit."""
    unit = Decimal(price_micros)
    if billing == "per_image":
        return price_micros
    if billing == "per_second":
        quantity = Decimal(repr(compute_s))
    elif billing == "per_megapixel":
        quantity = Decimal(pixels) / 1_000_000
    elif billing == "per_whole_megapixel":
        quantity = (Decimal(pixels) / 1_000_000).to_integral_value(rounding=ROUND_CEILING)
    else:
        raise ValueError(billing)
    return int((unit * quantity).to_integral_value(rounding=ROUND_CEILING))


class _Origin:
    def __init__(self, host: str, handler: type[BaseHTTPRequestHandler]) -> None:
        self.requests: list[Seen] = []
        self.httpd = _QuietServer((host, 0), handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)

    @property
    def origin(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _JobsServer:
    """Jobs, their polls, the bill, and both origins (the API and the files)."""

    AUTH = "Bearer"

    DEFAULT_SIZE = (1024, 1024)

    def __init__(
        self,
        *,
        page_size: int = 100,
        processing_polls: int = 1,
        output_format: str = "png",
        size: tuple[int, int] | None = None,
        compute_s: float = DEFAULT_COMPUTE_S,
        billing: str = "per_image",
        price_micros: int = 3_000,
    ) -> None:
        assert billing in BILLINGS, billing
        self.output_format = output_format  # what the outputs are: png, webp, jpeg, html, ...
        self.size = size  # None: the API's own default (or, on fal, the request's)
        self.compute_s = compute_s
        self.billing = billing
        self.price_micros = price_micros
        self.bills: dict[str, int] = {}  # job id -> what the provider charged for it
        self.bill_micros = 0
        self.jobs: dict[str, dict[str, Any]] = {}  # insertion order: oldest first
        self.jobs_made: Counter[tuple[str, int]] = Counter()  # per (prompt, seed)
        self.create_calls: Counter[tuple[str, int]] = Counter()
        self.cancels: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.page_size = page_size
        self.processing_polls = processing_polls
        self.reply: Callable[[str, str], tuple[int, Any] | None] | None = None
        self.lose_creates = 0
        self.failure_text = "the model crashed"  # a failed job's ``error``, as the API says it
        self.problems: dict[int, Any] = {}  # a refusal's body per status, instead of ours
        # the models the API knows (None: every one), each with its input schema's properties
        self.models: dict[str, dict[str, Any]] | None = None
        self.versions: dict[str, dict[str, Any]] = {}  # Replicate: pinned version -> inputs
        # the files origin answers every download with this status (401/403: the output
        # URL wants a credential); `output_query` is appended to every output URL
        self.refuse_downloads: int | None = None
        self.output_query = ""
        self.clock = 0.0  # the stand-in clock retention is counted on (`pass_time`)
        self.retention_s: float | None = None
        self.removal = "data_removed"
        self.throttle_creates = 0
        self.throttle_window_s: float | None = None
        self._window_until: float | None = None
        self.retry_after = "1"
        self.throttle_polls = 0
        self.create_log: list[tuple[float, int]] = []
        self.api = _Origin("127.0.0.1", _handler(self, api=True))
        self.files = _Origin(_second_loopback(), _handler(self, api=False))

    @property
    def requests(self) -> list[Seen]:
        return self.api.requests

    def __enter__(self) -> _JobsServer:
        self.api.start()
        self.files.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.api.stop()
        self.files.stop()

    def pass_time(self, seconds: float) -> None:
        """Move the stand-in clock retention is counted on."""
        self.clock += seconds

    def gone(self, job: dict[str, Any]) -> bool:
        """The job's output was deleted (its retention passed on the stand-in clock)."""
        return self.retention_s is not None and self.clock - job["made_at"] >= self.retention_s

    def throttled(self) -> tuple[int, Any, dict[str, str]] | None:
        """A create answered 429 by the throttle (nothing made), or None."""
        with self.lock:
            now = time.monotonic()
            if self.throttle_window_s is not None and self._window_until is None:
                self._window_until = now + self.throttle_window_s
            if self._window_until is not None and now < self._window_until:
                wait = str(max(1, int(self._window_until - now + 0.999)))
            elif self.throttle_creates > 0:
                self.throttle_creates -= 1
                wait = self.retry_after
            else:
                return None
        unit = "second" if wait == "1" else "seconds"
        body = {"detail": f"Request was throttled. Expected available in {wait} {unit}."}
        return 429, body, {"Retry-After": wait}

    def poll_throttled(self) -> tuple[int, Any, dict[str, str]] | None:
        with self.lock:
            if self.throttle_polls <= 0:
                return None
            self.throttle_polls -= 1
        body = {"detail": "Request was throttled. Your rate limit resets in ~1s."}
        return 429, body, {"Retry-After": self.retry_after}

    def authorized(self, header: str | None) -> bool:
        return header == f"{self.AUTH} {TOKEN}"

    def make(self, model: str, version: str | None, inputs: dict[str, Any]) -> dict[str, Any]:
        job_id = uuid.uuid4().hex[:24]
        key = (str(inputs.get("prompt")), int(inputs.get("seed", 0)))
        job = {
            "id": job_id,
            "model": model,
            "version": version,
            "input": inputs,
            "polls": 0,
            "status": "starting",
            "created_at": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
            "size": self.size_of(inputs),
            "compute_s": self.compute_of(str(inputs.get("prompt"))),
            "made_at": self.clock,
        }
        with self.lock:
            self.jobs[job_id] = job
            self.jobs_made[key] += 1
        return job

    def size_of(self, inputs: dict[str, Any]) -> tuple[int, int]:
        """The output's pixel size for a job of `inputs` (``[[SIZE:WxH]]`` in the prompt
        first: a model input that sets it, per item)."""
        found = _SIZE.search(str(inputs.get("prompt")))
        if found:
            return int(found[1]), int(found[2])
        return self.size or self.DEFAULT_SIZE

    def compute_of(self, prompt: str) -> float:
        """The compute time (seconds) the provider measures and reports for the job."""
        found = _COMPUTE.search(prompt)
        return int(found[1]) / 1000 if found else self.compute_s

    def billed(self, job: dict[str, Any], status: str) -> bool:
        """Whether the provider charges a job that ended `status` (Replicate: by output, or
        by the time it ran; fal: successful outputs only)."""
        if status == "succeeded":
            return True
        return self.billing == "per_second" and status in ("failed", "canceled")

    def finish(self, job: dict[str, Any], status: str) -> None:
        """The job reaches `status` (under the lock): the provider's bill counts it."""
        job["status"] = status
        if self.billed(job, status) and job["id"] not in self.bills:
            width, height = job["size"]
            bill = provider_bill(
                self.billing, self.price_micros, pixels=width * height, compute_s=job["compute_s"]
            )
            self.bills[job["id"]] = bill
            self.bill_micros += bill

    def advance(self, job: dict[str, Any]) -> None:
        """A poll: the job runs a little further (queued, running, then done)."""
        with self.lock:
            job["polls"] += 1
            if job["status"] in ("canceled", "failed", "succeeded", "aborted"):
                return
            prompt = str(job["input"].get("prompt"))
            if job["polls"] <= self.processing_polls:
                job["status"] = "processing"
            elif "[[ABORTED]]" in prompt:
                job["status"] = "aborted"
            elif "[[REMOTE_FAIL]]" in prompt:
                self.finish(job, "failed")
            else:
                self.finish(job, "succeeded")

    def output_url(self, job_id: str) -> str:
        return f"{self.files.origin}/files/{job_id}.png{self.output_query}"

    def file(self, job_id: str) -> tuple[int, Any]:
        if self.refuse_downloads is not None:
            return self.refuse_downloads, {"detail": "AccessDenied"}
        job = self.jobs.get(job_id)
        if job is None or self.gone(job):
            return 404, {"detail": "no such file"}
        prompt, seed = str(job["input"].get("prompt")), int(job["input"].get("seed", 0))
        width, height = job["size"]
        if self.output_format in ("png", "webp", "jpeg"):
            return 200, render_picture(prompt, seed, width, height, self.output_format)
        picture = render_picture(prompt, seed, width, height)
        return 200, render_output(self.output_format, picture)[0]

    def refused(self, inputs: dict[str, Any]) -> tuple[int, Any] | None:
        """A create refused by a marker (nothing made), counted per (prompt, seed); or lost
        at the gateway (`lose_creates`: 502, nothing made)."""
        with self.lock:
            lost, self.lose_creates = self.lose_creates > 0, max(0, self.lose_creates - 1)
        if lost:
            return 502, {"detail": "bad gateway"}
        prompt = str(inputs.get("prompt"))
        with self.lock:
            self.create_calls[(prompt, int(inputs.get("seed", 0)))] += 1
            calls = self.create_calls[(prompt, int(inputs.get("seed", 0)))]
        for name, code in (
            ("HTTP_429", 429),
            ("REFUSE_422", 422),
            ("HTTP_401", 401),
            ("HTTP_402", 402),
        ):
            if _hits(prompt, name, calls):
                default = {"title": name, "status": code, "detail": name.lower()}
                return code, self.problems.get(code, default)
        return None

    def after_made(self, inputs: dict[str, Any]) -> str | None:
        """What goes wrong after a job was made: ``drop``, ``502``, or None."""
        prompt = str(inputs.get("prompt"))
        calls = self.create_calls[(prompt, int(inputs.get("seed", 0)))]
        if _hits(prompt, "ACCEPT_DROP", calls):
            return "drop"
        if _hits(prompt, "CREATED_502", calls):
            return "502"
        return None

    def forced(self, kind: str, path: str) -> tuple[int, Any] | None:
        return None if self.reply is None else self.reply(kind, path)

    def kind_of(self, path: str) -> str:
        """What a GET asks for: ``list``, ``poll`` (a prediction or a fal status) or
        ``result`` (a fal result)."""
        if path == "/v1/predictions":
            return "list"
        if isinstance(self, FalServer) and not path.endswith("/status"):
            return "result"
        return "poll"

    # ------------------------------------------------------------ per API
    def create(self, path: str, body: Any) -> tuple[int, Any] | None:
        raise NotImplementedError

    def get(self, path: str, query: dict[str, list[str]]) -> tuple[int, Any]:
        raise NotImplementedError

    def cancel(self, method: str, path: str) -> tuple[int, Any]:
        raise NotImplementedError


class ReplicateServer(_JobsServer):
    AUTH = "Bearer"

    def __init__(self, *, output_as_string: bool = False, **options: Any) -> None:
        super().__init__(**options)
        self.output_as_string = output_as_string

    @property
    def base_url(self) -> str:
        return f"{self.api.origin}/v1"

    def prediction(self, job: dict[str, Any]) -> dict[str, Any]:
        reply = {
            key: job[key] for key in ("id", "model", "version", "input", "status", "created_at")
        }
        reply["urls"] = {
            "get": f"{self.base_url}/predictions/{job['id']}",
            "cancel": f"{self.base_url}/predictions/{job['id']}/cancel",
        }
        reply["output"] = None
        reply["error"] = self.failure_text if job["status"] == "failed" else None
        if job["status"] in ("succeeded", "failed", "canceled"):  # terminated: its metrics
            reply["metrics"] = {"predict_time": job["compute_s"], "total_time": job["compute_s"]}
        if job["status"] == "succeeded":
            url = self.output_url(job["id"])
            reply["output"] = url if self.output_as_string else [url]
            if self.gone(job) and self.removal == "data_removed":
                reply.update(output=None, input={}, data_removed=True)
        return reply

    def create(self, path: str, body: Any) -> tuple[int, Any] | None:
        if path == "/v1/predictions":
            version = body.get("version") if isinstance(body, dict) else None
            if not isinstance(version, str):
                return 422, {"title": "Invalid version", "status": 422, "detail": "version"}
            model = "owner/versioned"
        elif path.startswith("/v1/models/") and path.endswith("/predictions"):
            model, version = path.removeprefix("/v1/models/").removesuffix("/predictions"), None
            if isinstance(body, dict) and "version" in body:
                return 422, {"title": "Unexpected version", "status": 422, "detail": "version"}
        else:
            return 404, {"title": "Not found", "status": 404, "detail": "no such route"}
        inputs = body.get("input") if isinstance(body, dict) else None
        if not isinstance(inputs, dict) or not isinstance(inputs.get("prompt"), str):
            return 422, {"title": "Invalid input", "status": 422, "detail": "input.prompt"}
        if (refused := self.refused(inputs)) is not None:
            return refused
        job = self.make(model, version, inputs)
        after = self.after_made(inputs)
        if after == "drop":
            return None
        if after == "502":
            return 502, {"detail": "bad gateway"}
        return 201, self.prediction(job)

    def get(self, path: str, query: dict[str, list[str]]) -> tuple[int, Any]:
        if path == "/v1/account":
            return 200, {"type": "user", "username": "episodic-test", "name": "Test"}
        if path.startswith("/v1/models/"):
            return self.model_reply(path.removeprefix("/v1/models/"))
        if path == "/v1/predictions":
            return 200, self.listing(query)
        job = self.jobs.get(path.removeprefix("/v1/predictions/"))
        if job is None:
            return 404, {"title": "Not found", "status": 404, "detail": "no such prediction"}
        self.advance(job)
        return 200, self.prediction(job)

    def model_reply(self, rest: str) -> tuple[int, Any]:
        """``GET /v1/models/{owner}/{name}`` (with ``latest_version``) or
        ``.../versions/{id}``, each version with its ``openapi_schema`` as Cog publishes it."""
        model, _, version = rest.partition("/versions/")
        inputs = REPLICATE_INPUTS if self.models is None else self.models.get(model)
        if inputs is None or (version and version not in self.versions):
            return 404, {"title": "Not found", "status": 404, "detail": "Not found."}
        if version:
            return 200, self.version_reply(version, self.versions[version])
        owner, name = model.split("/", 1)
        return 200, {
            "url": f"https://replicate.com/{model}",
            "owner": owner,
            "name": name,
            "visibility": "public",
            "run_count": 1,
            "latest_version": self.version_reply("b" * 64, inputs),
        }

    @staticmethod
    def version_reply(version: str, inputs: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": version,
            "created_at": "2026-01-01T00:00:00.000000Z",
            "cog_version": "0.9.4",
            "openapi_schema": {
                "openapi": "3.0.2",
                "info": {"title": "Cog", "version": "0.1.0"},
                "paths": {"/predictions": {"post": {"summary": "Predict"}}},
                "components": {
                    "schemas": {
                        "Input": {
                            "type": "object",
                            "title": "Input",
                            "required": ["prompt"],
                            "properties": inputs,
                        },
                        "Output": {"type": "array", "items": {"type": "string"}},
                    }
                },
            },
        }

    def listing(self, query: dict[str, list[str]]) -> dict[str, Any]:
        after = query.get("created_after", [""])[0]
        cursor = int(query.get("cursor", ["0"])[0])
        with self.lock:
            jobs = [job for job in reversed(self.jobs.values()) if job["created_at"] >= after]
        page = jobs[cursor : cursor + self.page_size]
        reply: dict[str, Any] = {
            "results": [self.prediction(job) for job in page],
            "previous": None,
            "next": None,
        }
        if cursor + self.page_size < len(jobs):
            params = {"cursor": cursor + self.page_size, "created_after": after}
            reply["next"] = f"{self.base_url}/predictions?{urlencode(params)}"
        return reply

    def cancel(self, method: str, path: str) -> tuple[int, Any]:
        job_id = path.removeprefix("/v1/predictions/").removesuffix("/cancel")
        job = self.jobs.get(job_id)
        if method != "POST" or job is None:
            return 404, {"title": "Not found", "status": 404, "detail": "no such prediction"}
        with self.lock:
            self.cancels[job_id] += 1
            if job["status"] in ("starting", "processing"):
                self.finish(job, "canceled")
        return 200, self.prediction(job)


class FalServer(_JobsServer):
    AUTH = "Key"

    def billed(self, job: dict[str, Any], status: str) -> bool:
        # "You pay only for successful outputs" (fal): a result the model refused has none
        return status == "succeeded" and "[[RESULT_422]]" not in str(job["input"].get("prompt"))

    def size_of(self, inputs: dict[str, Any]) -> tuple[int, int]:
        if _SIZE.search(str(inputs.get("prompt"))) or self.size is not None:
            return super().size_of(inputs)
        wanted = inputs.get("image_size", "landscape_4_3")
        if isinstance(wanted, dict):
            return int(wanted["width"]), int(wanted["height"])
        return FAL_SIZES[str(wanted)]

    @property
    def base_url(self) -> str:
        return self.api.origin

    @property
    def schema_url(self) -> str:
        """fal's per-endpoint OpenAPI document (on the other origin: public, no key)."""
        return f"{self.files.origin}{OPENAPI_PATH}"

    def openapi(self, endpoint: str) -> tuple[int, Any]:
        """The OpenAPI 3 document of one endpoint (``?endpoint_id=``), as fal serves it:
        ``POST /{endpoint}`` takes a ``$ref`` to its input schema in ``components``."""
        inputs = FAL_INPUTS if self.models is None else self.models.get(endpoint)
        if inputs is None:
            return 404, {"detail": f"endpoint {endpoint} not found"}
        title = "".join(part.title() for part in re.split(r"[/_-]", endpoint)[1:])
        ref = {"$ref": f"#/components/schemas/{title}Input"}
        return 200, {
            "openapi": "3.0.4",
            "info": {
                "title": "Queue OpenAPI for " + endpoint,
                "x-fal-metadata": {"endpointId": endpoint},
            },
            "components": {
                "schemas": {
                    "QueueStatus": {"type": "object", "properties": {"status": {}}},
                    f"{title}Input": {
                        "title": "BaseInput",
                        "type": "object",
                        "required": ["prompt"],
                        "properties": inputs,
                    },
                    f"{title}Output": {"type": "object", "properties": {"images": {}}},
                }
            },
            "paths": {
                f"/{endpoint}/requests/{{request_id}}/status": {"get": {}},
                f"/{endpoint}": {
                    "post": {
                        "requestBody": {
                            "required": True,
                            "content": {"application/json": {"schema": ref}},
                        },
                        "responses": {"200": {"description": "The request status."}},
                    }
                },
            },
        }

    def create(self, path: str, body: Any) -> tuple[int, Any] | None:
        model = path.strip("/")
        if model.count("/") < 1 or "/requests/" in path:
            return 404, {"detail": "application not found"}
        if not isinstance(body, dict) or not isinstance(body.get("prompt"), str):
            return 422, {"detail": [{"loc": ["body", "prompt"], "msg": "field required"}]}
        if (refused := self.refused(body)) is not None:
            return refused
        job = self.make(model, None, body)
        after = self.after_made(body)
        if after == "drop":
            return None
        if after == "502":
            return 502, {"detail": "bad gateway", "error_type": "runner_disconnected"}
        app = "/".join(model.split("/")[:2])
        base = f"{self.base_url}/{app}/requests/{job['id']}"
        return 200, {
            "request_id": job["id"],
            "response_url": base,
            "status_url": f"{base}/status",
            "cancel_url": f"{base}/cancel",
            "queue_position": 0,
        }

    def _job(self, path: str) -> tuple[dict[str, Any] | None, str]:
        """The job a request URL names, and what follows its id; None when the URL is not
        ``/{owner}/{app}/requests/{id}...`` of the app the job was submitted to."""
        parts = path.strip("/").split("/")
        if len(parts) < 4 or parts[2] != "requests":
            return None, ""
        job = self.jobs.get(parts[3])
        if job is None or "/".join(job["model"].split("/")[:2]) != "/".join(parts[:2]):
            return None, ""
        return job, "/".join(parts[4:])

    def get(self, path: str, query: dict[str, list[str]]) -> tuple[int, Any]:
        job, rest = self._job(path)
        if job is None:
            return 404, {"detail": "request not found"}
        if rest == "status":
            self.advance(job)
            status = job["status"]
            if status in ("starting",):
                return 202, {"status": "IN_QUEUE", "request_id": job["id"], "queue_position": 0}
            if status == "processing":
                return 202, {"status": "IN_PROGRESS", "request_id": job["id"]}
            reply: dict[str, Any] = {"status": "COMPLETED", "request_id": job["id"]}
            if status in ("failed", "canceled", "aborted"):
                reply.update(error=self.failure_text, error_type="runner_failed")
            else:
                reply.update(metrics={"inference_time": job["compute_s"]}, logs=None)
            return 200, reply
        if rest == "":
            if self.gone(job) and self.removal == "data_removed":  # kept an hour only
                return 404, {"detail": "request not found"}
            if job["status"] != "succeeded":
                return 400, {"detail": "request not completed", "error_type": "bad_request"}
            if "[[RESULT_422]]" in str(job["input"].get("prompt")):
                detail = [{"loc": ["body", "image_size"], "msg": "value is not a valid preset"}]
                return 422, {"detail": detail}
            return 200, {
                "images": [
                    {
                        "url": self.output_url(job["id"]),
                        "width": job["size"][0],
                        "height": job["size"][1],
                        "content_type": f"image/{self.output_format}",
                    }
                ],
                "seed": job["input"].get("seed"),
                "has_nsfw_concepts": [False],
                "prompt": job["input"].get("prompt"),
                "timings": {"inference": job["compute_s"]},
            }
        return 404, {"detail": "not found"}

    def cancel(self, method: str, path: str) -> tuple[int, Any]:
        job, rest = self._job(path)
        if method != "PUT" or job is None or rest != "cancel":
            return 404, {"status": "NOT_FOUND"}
        with self.lock:
            self.cancels[job["id"]] += 1
            if job["status"] in ("starting", "processing"):
                self.finish(job, "canceled")
                return 202, {"status": "CANCELLATION_REQUESTED"}
        return 400, {"status": "ALREADY_COMPLETED"}


def _handler(server: _JobsServer, *, api: bool) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _record(self) -> None:
            headers = {name.lower(): value for name, value in self.headers.items()}
            (server.api if api else server.files).requests.append(
                Seen(self.command, self.path, headers)
            )

        def _send(self, code: int, body: Any, headers: dict[str, str] | None = None) -> None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(code)
            kind = _media_type(data) if isinstance(body, bytes) else "application/json"
            self.send_header("Content-Type", kind)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> Any:
            length = int(self.headers.get("Content-Length", "0"))
            raw = self.rfile.read(length) if length else b""
            try:
                return json.loads(raw) if raw else None
            except ValueError:
                return None

        def _authorized(self) -> bool:
            if not server.authorized(self.headers.get("Authorization")):
                self._send(401, {"title": "Unauthenticated", "status": 401, "detail": "token"})
                return False
            return True

        def do_POST(self) -> None:
            self._record()
            body = self._body()
            if not api:
                self._send(404, {"detail": "not found"})
            elif not self._authorized():
                return
            elif urlparse(self.path).path.endswith("/cancel"):
                self._send(*server.cancel("POST", urlparse(self.path).path))
            elif (throttle := server.throttled()) is not None:
                server.create_log.append((time.monotonic(), 429))
                self._send(*throttle)
            elif (reply := server.create(urlparse(self.path).path, body)) is None:
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)  # made, but the caller never hears
            elif (forced := server.forced("create", self.path)) is not None:
                server.create_log.append((time.monotonic(), forced[0]))
                self._send(*forced)
            else:
                server.create_log.append((time.monotonic(), reply[0]))
                self._send(*reply)

        def do_PUT(self) -> None:
            self._record()
            self._body()
            if not api:
                self._send(404, {"detail": "not found"})
            elif self._authorized():
                self._send(*server.cancel("PUT", urlparse(self.path).path))

        def do_GET(self) -> None:
            self._record()
            url = urlparse(self.path)
            if not api:
                if url.path.startswith("/files/"):  # outputs need no credential
                    self._send(*server.file(url.path.rsplit("/", 1)[-1].removesuffix(".png")))
                elif url.path == OPENAPI_PATH and isinstance(server, FalServer):
                    endpoint = parse_qs(url.query).get("endpoint_id", [""])[0]
                    self._send(*server.openapi(endpoint))
                else:
                    self._send(404, {"detail": "not found"})
            elif self._authorized():
                kind = server.kind_of(url.path)
                throttle = server.poll_throttled() if kind == "poll" else None
                if throttle is not None:
                    self._send(*throttle)
                    return
                forced = server.forced(kind, self.path)
                self._send(*(forced or server.get(url.path, parse_qs(url.query))))

    return Handler


def _media_type(data: bytes) -> str:
    """What a file body is, by its signature (a server names its outputs' type)."""
    if data.startswith(b"\x89PNG"):
        return "image/png"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    if data.startswith(b"\xff\xd8"):
        return "image/jpeg"
    return "application/octet-stream"
