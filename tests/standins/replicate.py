"""A stand-in of Replicate's HTTP API, written from Replicate's public documentation only.

Pages it follows (read 2026-12-05):

- HTTP API reference: https://replicate.com/docs/reference/http (endpoints, the prediction
  object, ``GET /v1/predictions`` newest first with a ``next`` cursor, cancel, account, models
  and versions with ``openapi_schema``).
- Creating predictions, sync mode: https://replicate.com/docs/topics/predictions/create-a-prediction
  ("Synchronous predictions hold the request open for a specified duration, which defaults to
  60 seconds"; ``Prefer: wait`` or ``Prefer: wait=n``; when the time runs out the reply is the
  prediction as it stands).
- Official models: https://replicate.com/docs/topics/models/official-models and
  https://replicate.com/changelog/2025-01-29-official-models (``POST
  /v1/models/{owner}/{name}/predictions`` without a version; "Instead of being charged by the
  amount of time a model runs, you're charged by output", e.g. per output image).
- Billing by time: https://replicate.com/docs/billing (other models are billed for the
  compute time they use: the prediction's ``metrics.predict_time``).
- Rate limits: https://replicate.com/docs/topics/predictions/rate-limits (600 creates a
  minute; "status ``429``" with a ``detail`` body; stronger limits as credit runs out).
- Data retention: https://replicate.com/docs/topics/predictions/data-retention ("For
  predictions created through the API, all input parameters, output values, output files, and
  logs are automatically removed after an hour, by default").
- Statuses and the reply's fields as Replicate's own client reads them
  (github.com/replicate/replicate-python, ``replicate/prediction.py``: ``starting``,
  ``processing``, ``succeeded``, ``failed``, ``canceled``, ``aborted``; ``logs``, ``error``,
  ``metrics``, ``urls``; ``data_removed`` in its recorded replies) and problem details
  (``replicate/exceptions.py``: "a problem details response as defined in RFC 7807",
  ``type``, ``title``, ``status``, ``detail``; RFC 9457, https://www.rfc-editor.org/rfc/rfc9457).

What is modelled
----------------
- ``POST /v1/models/{owner}/{name}/predictions`` (``{"input"}``) and ``POST /v1/predictions``
  (``{"version", "input"}``; ``version`` may be ``owner/name:id``). The reply is 201 with the
  prediction, ``status: starting``. ``Authorization: Bearer <token>``.
- ``Prefer: wait`` / ``Prefer: wait=n`` (n clamped to 1..60): the create is held until the
  prediction ends, or n seconds; a prediction that runs until cancelled is answered
  ``processing`` after ``min(n, max_hold_s)`` real seconds (``max_hold_s`` 0 by default).
- ``GET /v1/predictions/{id}``: ``starting``, then ``processing`` while it runs (each GET is a
  step of its run, ``Script.polls``), then ``succeeded`` (``output``: a list of URLs on the
  delivery origin, one per ``num_outputs``), ``failed`` (``error`` text, e.g. "CUDA out of
  memory", ``output: null``), ``canceled`` or ``aborted`` (ended before it started). A
  finished prediction carries ``metrics.predict_time`` (and ``total_time``), ``logs``,
  ``started_at``/``completed_at`` and ``data_removed``.
- ``GET /v1/predictions`` newest first, ``created_after``/``created_before`` filters,
  ``page_size`` a page, ``next`` an absolute URL with ``cursor`` (``previous`` likewise).
- ``POST /v1/predictions/{id}/cancel``: the prediction as it is after the call (``canceled``,
  or the terminal status it already had).
- ``GET /v1/account``; ``GET /v1/models/{owner}/{name}`` (``latest_version.openapi_schema``)
  and ``.../versions/{id}``, the input schema at ``components.schemas.Input.properties``.
- Problems (``Content-Type: application/problem+json``, ``{"title", "detail", "status"}``):
  401 (no or wrong token), 402 (no credit: ``credit_micros`` spent), 404, 422 (an input the
  model's schema refuses: a wrong type, a value outside its enum or range, a missing
  ``prompt``; an unknown version), 429 with ``Retry-After`` and "Request was throttled.
  Expected available in 1 second." as its ``detail``.
- Retention: ``retention_s`` (3600) after a prediction ended, on the stand-in's clock
  (``advance``), it reads ``output: null``, ``data_removed: true``, ``input: {}`` and
  ``logs: ""``, and its delivery URLs answer 404.
- Billing, the stand-in's own bill in micro-units (``bills``, ``bill_micros``):
  ``per_output_image`` (official models: ``price_micros`` per output image of a succeeded
  prediction; failed, canceled or aborted with no output: nothing) or ``per_second``
  (hardware-priced models: ``price_micros`` per second of ``metrics.predict_time``, rounded up
  to a micro-unit; billed when succeeded, failed or canceled after it started; aborted:
  nothing).

Assumed where the pages are silent
----------------------------------
- The 429 body: the rate-limit page shows ``{"detail": "Request was throttled. Your rate limit
  resets in ~30s."}``; the stand-in sends "Request was throttled. Expected available in N
  second(s)." (the throttle wording of Django REST framework, which Replicate's API has been
  seen answering with) inside a problem document (``title``, ``status``), and a
  ``Retry-After`` of the same N (the page does not name the header; Replicate's Python client
  reads it: ``replicate/client.py``, ``RetryTransport``).
- The problem titles and 402 wording ("Insufficient credit"), the 503 body, and that a 500 after
  a create is a problem document too.
- The 1:1 .. 21:9 ``aspect_ratio`` sizes (flux-schnell's, about one megapixel, multiples of
  16); ``output_format`` ``webp`` is the model's default, ``png`` here unless asked.
- Removal after the hour counts from ``completed_at``; removed input reads ``{}``; a removed
  prediction is still listed and still readable.
- A cancel of a prediction that was still ``starting`` ends it ``canceled`` with no
  ``predict_time`` (never ran, not billed); one that was ``processing`` reports the script's
  ``predict_time``.
- Not modelled: webhooks, streaming, deployments, trainings, the files API, collections and
  search, hardware listings.
- Unknown input names are ignored (not refused); a prediction of an official model carries
  the model's latest version id in ``version``.
"""

from __future__ import annotations

import hashlib
import re
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

from tests.standins._server import (
    CONTENT_TYPES,
    Reply,
    Seen,
    StandIn,
    ceil_micros,
    iso,
    render_picture,
    seconds_decimal,
)

TOKEN = "r8_standin_token_not_a_secret"
OFFICIAL_MODEL = "black-forest-labs/flux-schnell"
DEFAULT_PREDICT_TIME = 2.803618  # a predict_time from Replicate's own recorded replies
BILLINGS = ("per_output_image", "per_second")
TERMINAL = ("succeeded", "failed", "canceled", "aborted")
PROBLEMS = {  # status -> (title, detail) of the problem documents the stand-in sends
    401: ("Unauthenticated", "You did not pass a valid authentication token"),
    402: (
        "Insufficient credit",
        "You have insufficient credit to run this model. Go to "
        "https://replicate.com/account/billing#billing to purchase credit.",
    ),
    404: ("Not found", "The requested resource could not be found."),
    422: ("Input validation failed", "- input: the input is not valid"),
    500: ("Internal Server Error", "An unexpected error occurred."),
    503: ("Service Unavailable", "The service is temporarily unavailable."),
}
THROTTLED = "Request was throttled. Expected available in {n} second{s}."
ASPECT_SIZES = {  # flux-schnell's aspect_ratio enum, about one megapixel each (assumed)
    "1:1": (1024, 1024),
    "16:9": (1344, 768),
    "21:9": (1536, 640),
    "3:2": (1216, 832),
    "2:3": (832, 1216),
    "4:5": (896, 1088),
    "5:4": (1088, 896),
    "3:4": (896, 1184),
    "4:3": (1184, 896),
    "9:16": (768, 1344),
    "9:21": (640, 1536),
}
# black-forest-labs/flux-schnell's published Input schema (abridged to what is checked)
FLUX_SCHNELL_INPUT: dict[str, dict[str, Any]] = {
    "prompt": {"type": "string", "title": "Prompt", "x-order": 0},
    "seed": {"type": "integer", "title": "Seed", "x-order": 1},
    "go_fast": {"type": "boolean", "title": "Go Fast", "x-order": 2, "default": True},
    "megapixels": {"type": "string", "enum": ["1", "0.25"], "x-order": 3, "default": "1"},
    "num_outputs": {
        "type": "integer",
        "title": "Num Outputs",
        "minimum": 1,
        "maximum": 4,
        "default": 1,
        "x-order": 4,
    },
    "aspect_ratio": {
        "type": "string",
        "enum": list(ASPECT_SIZES),
        "default": "1:1",
        "x-order": 5,
    },
    "output_format": {
        "type": "string",
        "enum": ["webp", "jpg", "png"],
        "default": "webp",
        "x-order": 6,
    },
    "output_quality": {"type": "integer", "minimum": 0, "maximum": 100, "x-order": 7},
    "num_inference_steps": {"type": "integer", "minimum": 1, "maximum": 4, "x-order": 8},
    "disable_safety_checker": {"type": "boolean", "x-order": 9},
    "image": {"type": "string", "format": "uri", "x-order": 10},
}
_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
}
_ID = re.compile(r"[a-z0-9]{1,64}")
_OUTPUT = re.compile(r"/xezq/([a-z0-9]+)/out-([0-9]+)\.([a-z]+)")


@dataclass
class Script:
    """What one prediction does: its end ``status`` (``succeeded``, ``failed``,
    ``canceled``, ``aborted``), its ``error`` text and ``logs``, the ``predict_time`` it
    reports (None: the server's), the GETs answered ``processing`` before the one that finds it
    ended (``polls``; 0: the first GET finds it ended; None: it runs until cancelled), and how
    many outputs it makes (None: ``num_outputs``)."""

    status: str = "succeeded"
    error: str | None = None
    logs: str = ""
    predict_time: float | None = None
    polls: int | None = 1
    outputs: int | None = None


@dataclass
class Prediction:
    id: str
    model: str
    version: str
    input: dict[str, Any]
    script: Script
    created_at: datetime
    size: tuple[int, int]
    output_format: str
    status: str = "starting"
    gets: int = 0
    started_at: datetime | None = None
    completed_at: datetime | None = None
    predict_time: float | None = None
    output: list[str] | None = None
    error: str | None = None
    logs: str = ""
    data_removed: bool = False
    done: threading.Event = field(default_factory=threading.Event)
    sent_input: dict[str, Any] = field(default_factory=dict)  # kept after removal, for tests


class ReplicateStandIn(StandIn):
    """Replicate's predictions API on loopback (the module docstring says what and from
    where). ``base_url`` (``http://127.0.0.1:<port>/v1``) goes in a profile's ``base_url``."""

    def __init__(
        self,
        *,
        token: str = TOKEN,
        billing: str = "per_output_image",
        price_micros: int = 3_000,
        retention_s: float = 3600.0,
        predict_time: float = DEFAULT_PREDICT_TIME,
        polls: int | None = 1,
        output_format: str = "png",
        size: tuple[int, int] | None = None,
        credit_micros: int | None = None,
        page_size: int = 100,
        max_hold_s: float = 0.0,
        models: dict[str, dict[str, dict[str, Any]]] | None = None,
        versions: dict[str, str] | None = None,
        username: str = "standin",
    ) -> None:
        if billing not in BILLINGS:
            raise ValueError(f"billing is one of {BILLINGS}")
        super().__init__(token=token)
        self.billing = billing
        self.price_micros = price_micros
        self.retention_s = retention_s
        self.default_script = Script(predict_time=predict_time, polls=polls)
        self.output_format = output_format  # what the delivery serves unless the input asks
        self.size = size  # None: by the input's aspect_ratio
        self.credit_micros = credit_micros  # None: unlimited; spent: creates answer 402
        self.page_size = page_size
        self.max_hold_s = max_hold_s
        # model -> its Input properties; versions: version id -> model
        self.models = models if models is not None else {OFFICIAL_MODEL: FLUX_SCHNELL_INPUT}
        self.versions = versions  # None: any 64-hex version runs the first model
        self.username = username
        self.predictions: dict[str, Prediction] = {}  # oldest first
        self._scripts: list[tuple[Callable[[dict[str, Any]], bool], Script]] = []

    # ------------------------------------------------------------------ configuration
    @property
    def base_url(self) -> str:
        return f"{self.api.origin}/v1"

    @property
    def create_requests(self) -> list[Seen]:
        """The creates the API received (refused ones too), in order."""
        return [
            seen
            for seen in self.requests
            if seen.method == "POST" and seen.path.split("?")[0].endswith("/predictions")
        ]

    def script(self, match: str | Callable[[dict[str, Any]], bool], **fields: Any) -> None:
        """Predictions whose prompt contains ``match`` (or whose input ``match(input)``
        accepts) follow a `Script` with ``fields``; the first script armed that matches wins.
        Example: ``script("fox", status="failed", error="CUDA out of memory")``."""
        test = match if callable(match) else (lambda inputs: match in str(inputs.get("prompt")))
        self._scripts.append((test, replace(self.default_script, **fields)))

    def version_id(self, model: str) -> str:
        """The latest version id of ``model`` (deterministic)."""
        return hashlib.sha256(model.encode()).hexdigest()

    # ------------------------------------------------------------------ a test's handles
    def prediction(self, prediction_id: str) -> dict[str, Any]:
        """The prediction as ``GET /v1/predictions/{id}`` would answer now, without
        counting as a GET (no step of its run)."""
        with self.lock:
            return self._reply(self.predictions[prediction_id])

    def jobs_with(self, **fields: Any) -> int:
        """How many predictions were made whose input had every one of ``fields`` (e.g.
        ``jobs_with(prompt="a fox", seed=3)``), counted on the input as sent (the retention
        window never changes it)."""
        with self.lock:
            return sum(
                1
                for p in self.predictions.values()
                if all(p.sent_input.get(k) == v for k, v in fields.items())
            )

    def finish(self, prediction_id: str, status: str | None = None) -> None:
        """End a prediction now, as its script says (or with ``status``)."""
        with self.lock:
            found = self.predictions[prediction_id]
            self._end(found, status or found.script.status)

    # ------------------------------------------------------------------ the API
    def _api(self, seen: Seen, path: str, query: dict[str, list[str]]) -> Reply:
        if seen.headers.get("authorization") != f"Bearer {self.token}":
            return _problem(401, *PROBLEMS[401])
        method = seen.method
        if method == "GET" and (fault := self.read_faults.take()) is not None:
            return self._refused(fault.kind, fault.status, fault.retry_after, fault.body)
        if method == "POST" and path == "/v1/predictions":
            return self._create(seen, None)
        model = re.fullmatch(r"/v1/models/([^/]+/[^/]+)/predictions", path)
        if method == "POST" and model:
            return self._create(seen, model[1])
        cancel = re.fullmatch(r"/v1/predictions/([^/]+)/cancel", path)
        if method == "POST" and cancel:
            return self._cancel(cancel[1])
        one = re.fullmatch(r"/v1/predictions/([^/]+)", path)
        if method == "GET" and one:
            return self._get(one[1])
        if method == "GET" and path == "/v1/predictions":
            return self._list(query)
        if method == "GET" and path == "/v1/account":
            return Reply(200, {"type": "user", "username": self.username, "name": "Stand-in"})
        version = re.fullmatch(r"/v1/models/([^/]+/[^/]+)/versions/([^/]+)", path)
        if method == "GET" and version:
            return self._version(version[1], version[2])
        found = re.fullmatch(r"/v1/models/([^/]+/[^/]+)", path)
        if method == "GET" and found:
            return self._model(found[1])
        return _problem(404, "Not found", "The requested resource could not be found.")

    def _create(self, seen: Seen, model: str | None) -> Reply:
        with self.lock:
            self.create_calls += 1
        body = seen.json
        if not isinstance(body, dict) or not isinstance(body.get("input"), dict):
            return _problem(422, "Input validation failed", "- input: input is required")
        inputs: dict[str, Any] = body["input"]
        if model is None:
            model, version, refused = self._resolve_version(body.get("version"))
            if refused is not None:
                return refused
        else:
            if model not in self.models:
                return _problem(404, "Not found", f"Model {model} not found.")
            version = self.version_id(model)
        fault = self.faults.take()
        if fault is not None and fault.kind in ("throttle", "unavailable", "refuse"):
            return self._refused(fault.kind, fault.status, fault.retry_after, fault.body)
        if self.credit_micros is not None and self.bill_micros >= self.credit_micros:
            return _problem(402, *PROBLEMS[402])
        invalid = _invalid(inputs, self.models[model])
        if invalid:
            return _problem(422, "Input validation failed", invalid)
        made = self._make(model, version, inputs)
        if fault is not None and fault.kind == "lose_reply":
            return _problem(500, *PROBLEMS[500])
        if fault is not None and fault.kind == "drop_after_create":
            return Reply(drop=True)
        wait = _prefer_wait(seen.headers.get("prefer"))
        if wait is not None:
            self._hold(made, wait)
        with self.lock:
            return Reply(201, self._reply(made))

    def _resolve_version(self, value: object) -> tuple[str, str, Reply | None]:
        text = value if isinstance(value, str) else ""
        version = text.rsplit(":", 1)[-1]
        if self.versions is not None:
            model = self.versions.get(version)
        elif re.fullmatch(r"[0-9a-f]{64}", version):
            model = next(iter(self.models))
        else:
            model = None
        if model is None:
            refused = _problem(
                422,
                "Invalid version",
                "The specified version does not exist (or perhaps you "
                "don't have permission to use it?)",
            )
            return "", "", refused
        return model, version, None

    def _refused(self, kind: str, status: int, retry_after: str | None, body: Any) -> Reply:
        headers = {"Retry-After": retry_after} if retry_after is not None else {}
        if body is not None:
            return Reply(status, body, headers)
        if kind == "throttle":
            n = retry_after if retry_after is not None and retry_after.isdigit() else "1"
            detail = THROTTLED.format(n=n, s="" if n == "1" else "s")
            reply = _problem(429, "Request was throttled", detail)
        elif kind == "unavailable":
            reply = _problem(503, *PROBLEMS[503])
        else:
            title, detail = PROBLEMS.get(status, ("Request refused", "The request was refused."))
            reply = _problem(status, title, detail)
        reply.headers.update(headers)
        return reply

    def _make(self, model: str, version: str, inputs: dict[str, Any]) -> Prediction:
        script = next((s for test, s in self._scripts if test(inputs)), self.default_script)
        kind = str(inputs.get("output_format", self.output_format))
        made = Prediction(
            id=uuid.uuid4().hex[:26],
            model=model,
            version=version,
            input=dict(inputs),
            script=script,
            created_at=self.clock.now(),
            size=self.size or ASPECT_SIZES.get(str(inputs.get("aspect_ratio")), (1024, 1024)),
            output_format=kind if kind in CONTENT_TYPES else "png",
            sent_input=dict(inputs),
        )
        with self.lock:
            self.predictions[made.id] = made
            self.jobs_made[str(inputs.get("prompt"))] += 1
        return made

    def _hold(self, made: Prediction, wait: int) -> None:
        """Sync mode: the request is held while the model runs. A prediction with an end
        runs to it at once; one that runs until cancelled holds ``min(wait, max_hold_s)``."""
        with self.lock:
            if made.script.polls is not None:
                self._end(made, made.script.status)
                return
            self._start(made)
        made.done.wait(min(float(wait), self.max_hold_s))

    def _get(self, prediction_id: str) -> Reply:
        with self.lock:
            found = self.predictions.get(prediction_id)
            if found is None:
                return _problem(404, "Not found", "Prediction not found.")
            found.gets += 1
            if found.status not in TERMINAL:
                polls = found.script.polls
                if polls is None or found.gets <= polls:
                    self._start(found)
                else:
                    self._end(found, found.script.status)
            return Reply(200, self._reply(found))

    def _cancel(self, prediction_id: str) -> Reply:
        with self.lock:
            found = self.predictions.get(prediction_id)
            if found is None:
                return _problem(404, "Not found", "Prediction not found.")
            self.cancels[prediction_id] += 1
            if found.status not in TERMINAL:
                self._end(found, "canceled")
            return Reply(200, self._reply(found))

    def _list(self, query: dict[str, list[str]]) -> Reply:
        after = _when(query.get("created_after"))
        before = _when(query.get("created_before"))
        cursor = int((query.get("cursor") or ["0"])[0] or 0)
        with self.lock:
            newest_first = [
                p
                for p in reversed(self.predictions.values())
                if (after is None or p.created_at > after)
                and (before is None or p.created_at < before)
            ]
            page = newest_first[cursor : cursor + self.page_size]
            results = [self._reply(p) for p in page]
        kept = {k: v[0] for k, v in query.items() if k in ("created_after", "created_before")}

        def link(at: int) -> str:
            return f"{self.base_url}/predictions?{urlencode({**kept, 'cursor': at})}"

        more = cursor + self.page_size < len(newest_first)
        return Reply(
            200,
            {
                "next": link(cursor + self.page_size) if more else None,
                "previous": link(max(0, cursor - self.page_size)) if cursor else None,
                "results": results,
            },
        )

    def _model(self, model: str) -> Reply:
        if model not in self.models:
            return _problem(404, "Not found", f"Model {model} not found.")
        owner, name = model.split("/")
        version = self._version_object(model)
        return Reply(
            200,
            {
                "url": f"https://replicate.com/{model}",
                "owner": owner,
                "name": name,
                "visibility": "public",
                "run_count": 0,
                "latest_version": version,
            },
        )

    def _version(self, model: str, version: str) -> Reply:
        known = self.versions.get(version) == model if self.versions is not None else None
        if (
            model not in self.models
            or known is False
            or (
                known is None
                and version != self.version_id(model)
                and not re.fullmatch(r"[0-9a-f]{64}", version)
            )
        ):
            return _problem(404, "Not found", f"Version {version} of {model} not found.")
        return Reply(200, self._version_object(model, version))

    def _version_object(self, model: str, version: str | None = None) -> dict[str, Any]:
        return {
            "id": version or self.version_id(model),
            "created_at": iso(self.clock.now()),
            "cog_version": "0.9.0",
            "openapi_schema": {
                "openapi": "3.0.2",
                "info": {"title": "Cog", "version": "0.1.0"},
                "components": {
                    "schemas": {
                        "Input": {
                            "type": "object",
                            "title": "Input",
                            "required": ["prompt"],
                            "properties": self.models[model],
                        },
                        "Output": {"type": "array", "items": {"type": "string", "format": "uri"}},
                    }
                },
            },
        }

    # ------------------------------------------------------------------ a prediction's life
    def _start(self, found: Prediction) -> None:
        if found.status == "starting":
            found.status = "processing"
            found.started_at = self.clock.now()

    def _end(self, found: Prediction, status: str) -> None:
        """The prediction ends ``status`` (under the lock): its reply, its bill."""
        if found.status in TERMINAL:
            return
        script = found.script
        ran = found.status == "processing" or status != "canceled"
        if status == "aborted":
            ran = False
        now = self.clock.now()
        if ran:
            found.started_at = found.started_at or now
            found.predict_time = (
                script.predict_time
                if script.predict_time is not None
                else self.default_script.predict_time
            )
        found.status = status
        found.completed_at = now
        found.logs = script.logs
        if status == "failed":
            found.error = script.error or "Prediction failed."
        elif status == "succeeded":
            count = script.outputs
            if count is None:
                count = int(found.input.get("num_outputs", 1) or 1)
            found.output = [
                f"{self.delivery.origin}/xezq/{found.id}/out-{i}.{found.output_format}"
                for i in range(count)
            ]
        self.bill(found.id, self._charge(found))
        found.done.set()

    def _charge(self, found: Prediction) -> int:
        """The stand-in's own bill for a finished prediction, by the server's rule."""
        if self.billing == "per_output_image":
            images = len(found.output or []) if found.status == "succeeded" else 0
            return self.price_micros * images
        if found.status == "aborted" or not found.predict_time:
            return 0
        return ceil_micros(Decimal(self.price_micros) * seconds_decimal(found.predict_time))

    def _expire(self, found: Prediction) -> None:
        if found.data_removed or found.completed_at is None:
            return
        if self.clock.now() >= found.completed_at + timedelta(seconds=self.retention_s):
            found.data_removed = True
            found.output = None
            found.input = {}
            found.logs = ""

    def _reply(self, found: Prediction) -> dict[str, Any]:
        self._expire(found)
        reply: dict[str, Any] = {
            "id": found.id,
            "model": found.model,
            "version": found.version,
            "input": found.input,
            "logs": found.logs,
            "output": list(found.output) if found.output is not None else None,
            "data_removed": found.data_removed,
            "error": found.error,
            "status": found.status,
            "source": "api",
            "created_at": iso(found.created_at),
            "started_at": iso(found.started_at),
            "completed_at": iso(found.completed_at),
            "urls": {
                "get": f"{self.base_url}/predictions/{found.id}",
                "cancel": f"{self.base_url}/predictions/{found.id}/cancel",
                "web": f"https://replicate.com/p/{found.id}",
            },
        }
        if found.completed_at is not None:
            metrics: dict[str, Any] = {}
            if found.predict_time is not None:
                metrics["predict_time"] = found.predict_time
            total = (found.completed_at - found.created_at).total_seconds()
            metrics["total_time"] = max(total, found.predict_time or 0.0)
            reply["metrics"] = metrics
        return reply

    # ------------------------------------------------------------------ the delivery
    def _delivery(self, seen: Seen, path: str, query: dict[str, list[str]]) -> Reply:
        found_path = _OUTPUT.fullmatch(path)
        if seen.method != "GET" or found_path is None:
            return Reply(404, b"Not Found", content_type="text/plain")
        with self.lock:
            found = self.predictions.get(found_path[1])
            if found is not None:
                self._expire(found)
            index = int(found_path[2])
            if found is None or found.output is None or index >= len(found.output):
                return Reply(404, b"Not Found", content_type="text/plain")
            width, height = found.size
            kind = found.output_format
            text = f"{found.id}/{index}/{found.input.get('prompt')}/{found.input.get('seed')}"
        return Reply(
            200, render_picture(text, width, height, kind), content_type=CONTENT_TYPES[kind]
        )


def _problem(status: int, title: str, detail: str) -> Reply:
    return Reply(
        status,
        {"title": title, "detail": detail, "status": status},
        content_type="application/problem+json",
    )


def _prefer_wait(header: str | None) -> int | None:
    """``Prefer: wait`` (60 s) or ``wait=n`` (clamped to 1..60); None: async mode."""
    if not header:
        return None
    for part in header.split(","):
        token = part.strip().lower()
        if token == "wait":
            return 60
        found = re.fullmatch(r"wait=([0-9]{1,4})", token)
        if found:
            return max(1, min(60, int(found[1])))
    return None


def _when(values: list[str] | None) -> datetime | None:
    if not values:
        return None
    try:
        return datetime.fromisoformat(values[0].replace("Z", "+00:00"))
    except ValueError:
        return None


def _invalid(inputs: dict[str, Any], properties: dict[str, dict[str, Any]]) -> str:
    """What the model's input schema refuses in ``inputs`` ("" when nothing), in
    Replicate's ``- input.name: reason`` lines."""
    problems: list[str] = []
    if "prompt" in properties and "prompt" not in inputs:
        problems.append("- input: prompt is required")
    for name, value in inputs.items():
        spec = properties.get(name)
        if spec is None:
            continue  # unknown names are ignored
        kinds = _TYPES.get(str(spec.get("type")))
        if kinds is not None and (
            not isinstance(value, kinds) or (bool not in kinds and isinstance(value, bool))
        ):
            problems.append(f"- input.{name}: Invalid type. Expected: {spec['type']}")
            continue
        if "enum" in spec and value not in spec["enum"]:
            allowed = ", ".join(f'"{v}"' for v in spec["enum"])
            problems.append(f"- input.{name}: {name} must be one of the following: {allowed}")
        if "minimum" in spec and isinstance(value, int | float) and value < spec["minimum"]:
            problems.append(f"- input.{name}: Must be greater than or equal to {spec['minimum']}")
        if "maximum" in spec and isinstance(value, int | float) and value > spec["maximum"]:
            problems.append(f"- input.{name}: Must be less than or equal to {spec['maximum']}")
    return "\n".join(problems)


__all__ = [
    "BILLINGS",
    "FLUX_SCHNELL_INPUT",
    "OFFICIAL_MODEL",
    "TOKEN",
    "ReplicateStandIn",
    "Script",
]
