"""A stand-in of fal.ai's queue API, written from fal's public documentation only.

Pages it follows (read 2026-12-05):

- Queue: https://docs.fal.ai/documentation/model-apis/inference/queue (submit to
  ``queue.fal.run/{endpoint}``; ``IN_QUEUE`` -> ``IN_PROGRESS`` -> ``COMPLETED``; the COMPLETED
  status carries ``metrics.inference_time``; result, status and cancel URLs).
- Cancel: https://fal.ai/docs/inference-api/queue/cancel ("Do not add the endpoint path";
  answers ``OK``, ``CANCELLATION_REQUESTED``, ``ALREADY_COMPLETED``, ``NOT_FOUND``).
- Model arguments: https://docs.fal.ai/documentation/model-apis/model-arguments
  (``image_size`` presets: ``square_hd`` 1024x1024, ``square`` 512x512, ``portrait_4_3``
  768x1024, ``portrait_16_9`` 576x1024, ``landscape_4_3`` 1024x768, ``landscape_16_9``
  1024x576, or ``{width, height}``; ``num_images``; ``seed``); ``landscape_4_3`` is
  flux/dev's default (its API page).
- Pricing: https://docs.fal.ai/documentation/model-apis/pricing ("You pay only for successful
  outputs, and you are never charged for server errors or time spent waiting in the queue";
  image models per image or per megapixel of output) and flux/dev's page (per megapixel,
  "rounding up to the nearest megapixel").
- Errors: https://fal.ai/docs/documentation/model-apis/errors (model errors: ``detail`` an
  array of typed error objects, ``X-Fal-Retryable``) and
  https://docs.fal.ai/documentation/model-apis/request-errors (request errors: ``detail`` a
  string and ``error_type``, also in ``X-Fal-Error-Type``).
- Concurrency: https://docs.fal.ai/documentation/model-apis/concurrency-limits ("Requests are
  never rejected due to concurrency limits": they wait ``IN_QUEUE``). Rate limits:
  https://fal.ai/docs/documentation/serverless/reliability/rate-limits (429 with
  ``x-ratelimit-reset`` for the platform API that manages apps and runners, "They do not apply
  to the requests that call your app endpoints").
- Retention: https://docs.fal.ai/documentation/model-apis/media-expiration (CDN media: no fixed
  default, set per request by ``X-Fal-Object-Lifecycle-Preference:
  {"expiration_duration_seconds": n}``; "Expired files are permanently deleted"; request
  payloads kept 30 days).
- The status shapes as fal's own client reads them (github.com/fal-ai/fal,
  ``projects/fal_client/src/fal_client/client.py``: ``queue_position`` when queued, ``logs``,
  ``metrics`` ("legacy apps might not return metrics"), ``error`` and ``error_type`` on a
  COMPLETED status; errors read from ``detail``).

What is modelled
----------------
- ``POST /{owner}/{app}[/{subpath}]`` with the model's input as the body, ``Authorization: Key
  <key>``: 200 ``{"request_id", "response_url", "status_url", "cancel_url",
  "queue_position"}`` (URLs on the owner and app, without the subpath).
- ``GET /{owner}/{app}/requests/{id}/status`` (``?logs=1``): 202 ``IN_QUEUE``
  (``queue_position``), 202 ``IN_PROGRESS``, 200 ``COMPLETED`` with ``metrics.inference_time``;
  a failed request is ``COMPLETED`` with ``error`` and ``error_type``. Each status GET is a
  step of the request's run (`Script`).
- ``GET /{owner}/{app}/requests/{id}``: the result, ``images: [{url, width, height,
  content_type}]``, ``seed``, ``has_nsfw_concepts``, ``timings``, ``prompt``; a failed request
  answers its error (``Script.result_status``: 422 with a ``detail`` list for the model's
  validation, 5xx with ``detail`` and ``error_type`` for a request error).
- ``PUT /{owner}/{app}/requests/{id}/cancel``: 202 ``CANCELLATION_REQUESTED`` (queued: removed
  from the queue; running: the app is signalled and stops, or, with ``Script.stops_on_cancel``
  False, goes on to complete and is billed), 400 ``ALREADY_COMPLETED``, 404 ``NOT_FOUND``.
- Errors ``{"detail": ...}``: 401 (no or wrong key), 403 (the account is locked: its
  ``credit_micros`` are spent), 404 (an app the stand-in does not serve, an unknown request,
  a status URL with the subpath), 422 on the result (an ``image_size`` preset that does not
  exist, a ``width``/``height`` out of range, no ``prompt``).
- Billing, the stand-in's own bill in micro-units (``bills``, ``bill_micros``), successful
  requests only: ``per_megapixel_ceil`` (default; ``price_micros`` per started megapixel of
  each image, a megapixel being 1,000,000 pixels: 1024x1024 bills 2, 1024x768 bills 1),
  ``per_megapixel`` (exact, rounded up to a micro-unit), ``per_image``, or ``per_second`` (of
  ``inference_time``).
- Retention: media kept unless ``media_retention_s`` (server-wide) or the request's
  ``X-Fal-Object-Lifecycle-Preference`` sets one; then the media URL answers 404 after it (on
  the stand-in's clock, from completion). Payloads (status, result) answer 404 after
  ``payload_retention_s`` (30 days).
- The endpoint's OpenAPI document, public, on the delivery origin (``schema_url``,
  ``?endpoint_id=``), as ``providers check`` reads it.

Assumed where the pages are silent
----------------------------------
- fal documents no 429 for queue submits (concurrency queues, the rate-limit page exempts
  endpoint calls): a 429 or 503 happens here only when a test arms one (``throttle``,
  ``unavailable``), with ``Retry-After`` when given, and body ``{"detail": ...}``.
- A result read before COMPLETED answers 400 ``{"detail": "Request is still in progress"}``;
  a cancelled request ends COMPLETED with ``error: "Request was cancelled"`` and
  ``error_type: "request_cancelled"`` (not billed); the wording of 401, 403 and 404 bodies.
- Validation happens at the runner: a submit with a bad ``image_size`` is accepted (a
  ``request_id``), and the request ends COMPLETED with an error and a 422 result.
- Not modelled: the synchronous ``fal.run`` endpoint, streaming, webhooks, file uploads, the
  platform API (payload deletion, usage).
- ``width``/``height`` accepted from 64 to 14142 each (assumed bounds); outputs are served as
  ``png`` unless the input's ``output_format`` asks for ``jpeg`` (flux/dev's own default).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from decimal import ROUND_CEILING, Decimal
from typing import Any

from tests.standins._server import (
    CONTENT_TYPES,
    MILLION,
    Fault,
    Reply,
    Seen,
    StandIn,
    ceil_micros,
    render_picture,
    seconds_decimal,
)

TOKEN = "standin-key-id:standin-key-secret-not-a-secret"
MODEL = "fal-ai/flux/dev"
DEFAULT_INFERENCE_TIME = 1.873  # seconds, a typical flux/dev inference_time
BILLINGS = ("per_megapixel_ceil", "per_megapixel", "per_image", "per_second")
IMAGE_SIZES = {
    "square_hd": (1024, 1024),
    "square": (512, 512),
    "portrait_4_3": (768, 1024),
    "portrait_16_9": (576, 1024),
    "landscape_4_3": (1024, 768),
    "landscape_16_9": (1024, 576),
}
DEFAULT_IMAGE_SIZE = "landscape_4_3"
MIN_SIDE, MAX_SIDE = 64, 14142
OPENAPI_PATH = "/api/openapi/queue/openapi.json"
PAYLOAD_RETENTION_S = 30 * 24 * 3600.0
DETAILS = {  # status -> the ``detail`` the stand-in sends (wording assumed)
    401: "Authentication is required to access this application. Pass your key in the "
    "Authorization header as 'Key <key>'.",
    403: "User is locked. Reason: Exhausted balance. Top up your balance at "
    "fal.ai/dashboard/billing.",
    422: [{"loc": ["body"], "msg": "Input is not valid", "type": "value_error"}],
    429: "Too many requests",
    500: "Internal Server Error",
    503: "Service unavailable",
}
# fal-ai/flux/dev's published input (abridged to what is checked)
FLUX_DEV_INPUT: dict[str, dict[str, Any]] = {
    "prompt": {"type": "string", "title": "Prompt"},
    "image_size": {"title": "Image Size", "default": DEFAULT_IMAGE_SIZE},
    "num_inference_steps": {"type": "integer", "minimum": 1, "maximum": 50, "default": 28},
    "seed": {"type": "integer", "title": "Seed"},
    "guidance_scale": {"type": "number", "default": 3.5},
    "sync_mode": {"type": "boolean", "default": False},
    "num_images": {"type": "integer", "minimum": 1, "maximum": 4, "default": 1},
    "enable_safety_checker": {"type": "boolean", "default": True},
    "output_format": {"type": "string", "enum": ["jpeg", "png"], "default": "jpeg"},
    "acceleration": {"type": "string", "enum": ["none", "regular", "high"]},
}
_OUTPUT = re.compile(r"/files/standin/([A-Za-z0-9-]+)_([0-9]+)\.([a-z]+)")


@dataclass
class Script:
    """What one request does: ``queue_polls`` status GETs answered ``IN_QUEUE``, then
    ``polls`` answered ``IN_PROGRESS`` (None: it runs until cancelled), then COMPLETED. A
    failed request has ``error`` (and ``error_type``); its result answers ``result_status``
    with ``detail``. ``inference_time`` (None: the server's) is what its metrics report.
    ``stops_on_cancel``: False for a model app that goes on after a cancel reached it while it
    ran (fal: "The model app decides how to stop the work"): it completes and is billed."""

    queue_polls: int = 1
    polls: int | None = 1
    error: str | None = None
    error_type: str | None = None
    result_status: int = 500
    detail: Any = None
    inference_time: float | None = None
    stops_on_cancel: bool = True


@dataclass
class Request:
    id: str
    endpoint: str  # as submitted, with its subpath
    app: str  # owner/app
    input: dict[str, Any]
    script: Script
    created_at: datetime
    sizes: list[tuple[int, int]]
    output_format: str
    media_retention_s: float | None
    status: str = "IN_QUEUE"
    gets: int = 0
    completed_at: datetime | None = None
    cancelled: bool = False
    invalid: list[dict[str, Any]] | None = None

    @property
    def failed(self) -> bool:
        return self.cancelled or bool(self.invalid) or self.script.error is not None


class FalStandIn(StandIn):
    """fal's queue API on loopback (the module docstring says what and from where).
    ``base_url`` (``http://127.0.0.1:<port>``, queue.fal.run's place) goes in a profile's
    ``base_url``; ``schema_url`` in its ``schema_url``."""

    def __init__(
        self,
        *,
        token: str = TOKEN,
        billing: str = "per_megapixel_ceil",
        price_micros: int = 25_000,
        inference_time: float = DEFAULT_INFERENCE_TIME,
        queue_polls: int = 1,
        polls: int | None = 1,
        output_format: str = "png",
        credit_micros: int | None = None,
        media_retention_s: float | None = None,
        payload_retention_s: float = PAYLOAD_RETENTION_S,
        models: dict[str, dict[str, dict[str, Any]]] | None = None,
    ) -> None:
        if billing not in BILLINGS:
            raise ValueError(f"billing is one of {BILLINGS}")
        super().__init__(token=token)
        self.billing = billing
        self.price_micros = price_micros
        self.default_script = Script(
            queue_polls=queue_polls, polls=polls, inference_time=inference_time
        )
        self.output_format = output_format
        self.credit_micros = credit_micros  # None: unlimited; spent: submits answer 403
        self.media_retention_s = media_retention_s
        self.payload_retention_s = payload_retention_s
        # endpoint id (owner/app[/subpath]) -> its input properties
        self.models = models if models is not None else {MODEL: FLUX_DEV_INPUT}
        self.fal_requests: dict[str, Request] = {}  # oldest first
        self._scripts: list[tuple[Callable[[dict[str, Any]], bool], Script]] = []

    # ------------------------------------------------------------------ configuration
    @property
    def base_url(self) -> str:
        return self.api.origin

    @property
    def schema_url(self) -> str:
        return f"{self.delivery.origin}{OPENAPI_PATH}"

    @property
    def create_requests(self) -> list[Seen]:
        """The submits the API received (refused ones too), in order."""
        return [seen for seen in self.requests if seen.method == "POST"]

    def script(self, match: str | Callable[[dict[str, Any]], bool], **fields: Any) -> None:
        """Requests whose prompt contains ``match`` (or whose input ``match(input)``
        accepts) follow a `Script` with ``fields``; the first script armed that matches wins.
        Example: ``script("fox", error="CUDA out of memory", error_type="runner_server_error")``."""
        test = match if callable(match) else (lambda inputs: match in str(inputs.get("prompt")))
        self._scripts.append((test, replace(self.default_script, **fields)))

    # ------------------------------------------------------------------ a test's handles
    def jobs_with(self, **fields: Any) -> int:
        """How many requests were made whose input had every one of ``fields`` (e.g.
        ``jobs_with(prompt="a fox", seed=3)``)."""
        with self.lock:
            return sum(
                1
                for r in self.fal_requests.values()
                if all(r.input.get(k) == v for k, v in fields.items())
            )

    def finish(self, request_id: str) -> None:
        """End a request now (COMPLETED, as its script says)."""
        with self.lock:
            self._complete(self.fal_requests[request_id])

    def size_of(self, image_size: object) -> tuple[int, int] | None:
        """The pixel size an ``image_size`` input asks for (None: not a valid one)."""
        if image_size is None:
            return IMAGE_SIZES[DEFAULT_IMAGE_SIZE]
        if isinstance(image_size, str):
            return IMAGE_SIZES.get(image_size)
        if isinstance(image_size, dict):
            width, height = image_size.get("width"), image_size.get("height")
            if all(
                isinstance(v, int) and not isinstance(v, bool) and MIN_SIDE <= v <= MAX_SIDE
                for v in (width, height)
            ):
                return int(width), int(height)  # type: ignore[arg-type]
        return None

    # ------------------------------------------------------------------ the API
    def _api(self, seen: Seen, path: str, query: dict[str, list[str]]) -> Reply:
        if seen.headers.get("authorization") != f"Key {self.token}":
            return _error(401, DETAILS[401])
        if seen.method == "GET" and (fault := self.read_faults.take()) is not None:
            return _refused(fault)
        parts = path.strip("/").split("/")
        if seen.method == "POST":
            return self._submit(seen, "/".join(parts))
        if len(parts) >= 4 and parts[2] == "requests":
            app, request_id, rest = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
            if seen.method == "PUT" and rest == "cancel":
                return self._cancel(app, request_id)
            if seen.method == "GET" and rest == "status":
                return self._status(app, request_id, "1" in query.get("logs", []))
            if seen.method == "GET" and rest == "":
                return self._result(app, request_id)
        return _error(404, "Not Found")

    def _submit(self, seen: Seen, endpoint: str) -> Reply:
        with self.lock:
            self.create_calls += 1
        if endpoint.count("/") < 1 or "/requests/" in f"/{endpoint}/":
            return _error(404, f"Application '{endpoint}' not found")
        properties = self.models.get(endpoint)
        if properties is None:
            return _error(404, f"Application '{endpoint}' not found")
        body = seen.json
        if not isinstance(body, dict):
            return _error(422, [_field("body", "Input should be a valid dictionary", "dict_type")])
        fault = self.faults.take()
        if fault is not None and fault.kind in ("throttle", "unavailable", "refuse"):
            return _refused(fault)
        if self.credit_micros is not None and self.bill_micros >= self.credit_micros:
            return _error(403, DETAILS[403])
        made = self._make(endpoint, body, seen.headers.get("x-fal-object-lifecycle-preference"))
        if fault is not None and fault.kind == "lose_reply":
            return _error(500, "Internal Server Error")
        if fault is not None and fault.kind == "drop_after_create":
            return Reply(drop=True)
        base = f"{self.base_url}/{made.app}/requests/{made.id}"
        return Reply(
            200,
            {
                "request_id": made.id,
                "response_url": base,
                "status_url": f"{base}/status",
                "cancel_url": f"{base}/cancel",
                "queue_position": self._position(made),
            },
        )

    def _make(self, endpoint: str, inputs: dict[str, Any], lifecycle: str | None) -> Request:
        script = next((s for test, s in self._scripts if test(inputs)), self.default_script)
        invalid: list[dict[str, Any]] = []
        if not isinstance(inputs.get("prompt"), str):
            invalid.append(_field("prompt", "Field required", "missing"))
        size = self.size_of(inputs.get("image_size"))
        if size is None:
            invalid.append(
                _field(
                    "image_size",
                    "Input should be one of: " + ", ".join(IMAGE_SIZES) + ", or {width, height}",
                    "enum",
                )
            )
        count = inputs.get("num_images", 1)
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= 4:
            invalid.append(_field("num_images", "Input should be between 1 and 4", "range"))
            count = 1
        kind = str(inputs.get("output_format", self.output_format))
        made = Request(
            id=str(uuid.uuid4()),
            endpoint=endpoint,
            app="/".join(endpoint.split("/")[:2]),
            input=dict(inputs),
            script=script,
            created_at=self.clock.now(),
            sizes=[size or (0, 0)] * count,
            output_format=kind if kind in CONTENT_TYPES else "png",
            media_retention_s=_lifecycle(lifecycle, self.media_retention_s),
            invalid=invalid or None,
        )
        with self.lock:
            self.fal_requests[made.id] = made
            self.jobs_made[str(inputs.get("prompt"))] += 1
        return made

    def _position(self, made: Request) -> int:
        with self.lock:
            return sum(
                1
                for other in self.fal_requests.values()
                if other.status == "IN_QUEUE" and other.created_at < made.created_at
            )

    def _find(self, app: str, request_id: str) -> Request | None:
        found = self.fal_requests.get(request_id)
        if found is None or found.app != app:
            return None
        if found.completed_at is not None and self.clock.now() >= found.completed_at + timedelta(
            seconds=self.payload_retention_s
        ):
            return None  # the payload is gone after its retention
        return found

    def _status(self, app: str, request_id: str, logs: bool) -> Reply:
        with self.lock:
            found = self._find(app, request_id)
            if found is None:
                return _error(404, "Request not found")
            found.gets += 1
            script = found.script
            if found.status != "COMPLETED":
                if found.gets > script.queue_polls:
                    found.status = "IN_PROGRESS"
                if (
                    found.status == "IN_PROGRESS"
                    and script.polls is not None
                    and found.gets > script.queue_polls + script.polls
                ) or found.invalid:
                    self._complete(found)
            base = f"{self.base_url}/{found.app}/requests/{found.id}"
            reply: dict[str, Any] = {
                "status": found.status,
                "request_id": found.id,
                "response_url": base,
                "status_url": f"{base}/status",
                "cancel_url": f"{base}/cancel",
                "logs": [] if logs else None,
            }
            if found.status == "IN_QUEUE":
                reply["queue_position"] = self._position(found)
                return Reply(202, reply)
            if found.status == "IN_PROGRESS":
                return Reply(202, reply)
            reply["metrics"] = (
                {} if found.failed else {"inference_time": self._inference_time(found)}
            )
            if found.failed:
                error, error_type = self._error_of(found)
                reply["error"] = error
                reply["error_type"] = error_type
            return Reply(200, reply)

    def _result(self, app: str, request_id: str) -> Reply:
        with self.lock:
            found = self._find(app, request_id)
            if found is None:
                return _error(404, "Request not found")
            if found.status != "COMPLETED":
                return _error(400, "Request is still in progress")
            if found.invalid:
                return Reply(422, {"detail": found.invalid}, {"X-Fal-Retryable": "false"})
            if found.failed:
                error, error_type = self._error_of(found)
                status = 400 if found.cancelled else found.script.result_status
                detail = found.script.detail if found.script.detail is not None else error
                headers = {"X-Fal-Error-Type": error_type} if error_type else {}
                body: dict[str, Any] = {"detail": detail}
                if error_type:
                    body["error_type"] = error_type
                return Reply(status, body, headers)
            images = [
                {
                    "url": self._output_url(found, i),
                    "width": width,
                    "height": height,
                    "content_type": CONTENT_TYPES[found.output_format],
                }
                for i, (width, height) in enumerate(found.sizes)
            ]
            return Reply(
                200,
                {
                    "images": images,
                    "timings": {"inference": self._inference_time(found)},
                    "seed": found.input.get("seed", 0),
                    "has_nsfw_concepts": [False] * len(images),
                    "prompt": found.input.get("prompt"),
                },
            )

    def _cancel(self, app: str, request_id: str) -> Reply:
        with self.lock:
            found = self._find(app, request_id)
            if found is None:
                return Reply(404, {"status": "NOT_FOUND"})
            self.cancels[request_id] += 1
            if found.status == "COMPLETED":
                return Reply(400, {"status": "ALREADY_COMPLETED"})
            if found.status == "IN_QUEUE" or found.script.stops_on_cancel:
                found.cancelled = True
                self._complete(found)
            return Reply(202, {"status": "CANCELLATION_REQUESTED"})

    # ------------------------------------------------------------------ a request's end
    def _complete(self, found: Request) -> None:
        if found.status == "COMPLETED":
            return
        found.status = "COMPLETED"
        found.completed_at = self.clock.now()
        if not found.failed:  # fal bills successful outputs only
            self.bill(found.id, self._charge(found))

    def _charge(self, found: Request) -> int:
        price = Decimal(self.price_micros)
        if self.billing == "per_image":
            return self.price_micros * len(found.sizes)
        if self.billing == "per_second":
            return ceil_micros(price * seconds_decimal(self._inference_time(found)))
        total = Decimal(0)
        for width, height in found.sizes:
            megapixels = Decimal(width * height) / MILLION
            if self.billing == "per_megapixel_ceil":
                megapixels = megapixels.to_integral_value(rounding=ROUND_CEILING)
            total += price * megapixels
        return ceil_micros(total)

    def _inference_time(self, found: Request) -> float:
        own = found.script.inference_time
        return own if own is not None else float(self.default_script.inference_time or 0.0)

    @staticmethod
    def _error_of(found: Request) -> tuple[str, str | None]:
        if found.cancelled:
            return "Request was cancelled", "request_cancelled"
        if found.invalid:
            return "Unprocessable Entity: " + str(found.invalid[0]["msg"]), None
        return str(found.script.error), found.script.error_type

    def _output_url(self, found: Request, index: int) -> str:
        return f"{self.delivery.origin}/files/standin/{found.id}_{index}.{found.output_format}"

    # ------------------------------------------------------------------ the delivery
    def _delivery(self, seen: Seen, path: str, query: dict[str, list[str]]) -> Reply:
        if seen.method == "GET" and path == OPENAPI_PATH:
            return self._openapi((query.get("endpoint_id") or [""])[0])
        found_path = _OUTPUT.fullmatch(path)
        if seen.method != "GET" or found_path is None:
            return Reply(404, b"Not Found", content_type="text/plain")
        with self.lock:
            found = self.fal_requests.get(found_path[1])
            index = int(found_path[2])
            if (
                found is None
                or found.failed
                or found.completed_at is None
                or index >= len(found.sizes)
            ):
                return Reply(404, b"Not Found", content_type="text/plain")
            keep = found.media_retention_s
            if keep is not None and self.clock.now() >= found.completed_at + timedelta(
                seconds=keep
            ):
                return Reply(404, b"Not Found", content_type="text/plain")
            width, height = found.sizes[index]
            kind = found.output_format
            text = f"{found.id}/{index}/{found.input.get('prompt')}/{found.input.get('seed')}"
        return Reply(
            200, render_picture(text, width, height, kind), content_type=CONTENT_TYPES[kind]
        )

    def _openapi(self, endpoint: str) -> Reply:
        """The OpenAPI document of one endpoint, as fal publishes it: ``POST /{endpoint}``
        takes a ``$ref`` to its input schema."""
        properties = self.models.get(endpoint)
        if properties is None:
            return Reply(404, {"detail": f"Endpoint '{endpoint}' not found"})
        title = "".join(part.title() for part in re.split(r"[/_-]", endpoint)[1:])
        return Reply(
            200,
            {
                "openapi": "3.0.4",
                "info": {"title": f"Queue OpenAPI for {endpoint}"},
                "components": {
                    "schemas": {
                        f"{title}Input": {
                            "type": "object",
                            "required": ["prompt"],
                            "properties": properties,
                        },
                    }
                },
                "paths": {
                    f"/{endpoint}": {
                        "post": {
                            "requestBody": {
                                "required": True,
                                "content": {
                                    "application/json": {
                                        "schema": {"$ref": f"#/components/schemas/{title}Input"}
                                    }
                                },
                            }
                        }
                    }
                },
            },
        )


def _refused(fault: Fault) -> Reply:
    headers = {"Retry-After": fault.retry_after} if fault.retry_after else {}
    if fault.body is not None:
        return Reply(fault.status, fault.body, headers)
    reply = _error(fault.status, DETAILS.get(fault.status, "Request refused"))
    reply.headers.update(headers)
    return reply


def _error(status: int, detail: Any) -> Reply:
    return Reply(status, {"detail": detail})


def _field(name: str, msg: str, kind: str) -> dict[str, Any]:
    return {"loc": ["body", name], "msg": msg, "type": kind}


def _lifecycle(header: str | None, default: float | None) -> float | None:
    """The media retention a request asks for (``X-Fal-Object-Lifecycle-Preference``), else
    the server's."""
    if not header:
        return default
    try:
        value = json.loads(header).get("expiration_duration_seconds", default)
    except (ValueError, AttributeError):
        return default
    return float(value) if isinstance(value, int | float) else None


__all__ = ["BILLINGS", "FLUX_DEV_INPUT", "IMAGE_SIZES", "MODEL", "TOKEN", "FalStandIn", "Script"]
