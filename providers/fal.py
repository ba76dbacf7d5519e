"""fal.ai's queue API (https://docs.fal.ai/model-endpoints/queue), as it documents it.

- **Submit** ``POST https://queue.fal.run/{model}`` (``model`` may have a subpath, e.g.
  ``fal-ai/flux/dev``) with the model's input as the body; ``Authorization: Key <key>``; the
  reply's ``request_id`` is the job. fal documents **no idempotency key** and **no way to
  find a request by anything we send**: the queue has no listing, so an unknown outcome is
  left to an operator (the adapter declares neither capability, and never sends again).
- **Collect**: the status, result and cancel URLs use the owner and app only, without the
  subpath (``fal-ai/flux/requests/{id}/status``). ``IN_QUEUE`` and ``IN_PROGRESS`` (HTTP 202)
  are polled again; ``COMPLETED`` with ``error`` or ``error_type`` is a failed request;
  otherwise the result ``GET .../requests/{id}`` holds ``images: [{url, ...}]``, downloaded
  without the credential (fal's CDN). A result answered 422 with a ``detail`` (the model's
  validation or content error) is a failed request too; any other error is polled again.
  The COMPLETED status carries ``metrics.inference_time`` ("Seconds the runner spent
  processing (only when COMPLETED)", https://docs.fal.ai/documentation/model-apis/inference/queue;
  legacy apps may send none): the compute time a per_second price is charged on.
- **Cancel** ``PUT .../requests/{id}/cancel``: ``{"status": "CANCELLATION_REQUESTED" |
  "ALREADY_COMPLETED" | "NOT_FOUND" | "OK"}``.
- **Check**: fal documents no free endpoint that verifies an ordinary key; ``episodic
  providers check`` verifies the endpoint and its input names against the endpoint's public
  OpenAPI schema (``https://fal.ai/api/openapi/queue/openapi.json?endpoint_id=...``, the
  profile's ``schema_url``) and says the key cannot be checked without spending.

Errors on submit, by what they prove (a refused submit has no ``request_id``): 429
`RateLimited`; any other 4xx but 409 `PermanentProviderError` (401, 403 locked account, 404
unknown app, 422 invalid input); 409 (fal's own client sends it again: it proves nothing),
3xx, 5xx, a 2xx without a request id, or no reply `UnknownOutcome`.

Cost: a failed request is **not billed** (`RemoteJobFailed(billed=False)`): fal's pricing
(https://docs.fal.ai/documentation/model-apis/pricing, read 2026-12-02) says "You pay only
for successful outputs, and you are never charged for server errors or time spent waiting
in the queue." A delivered image costs the profile's price on its basis: per image, per
megapixel of the stored image (fal's own rule for FLUX: "Images are billed by rounding up
to the nearest megapixel", ``whole_megapixels: true``), or per second of the reported
``metrics.inference_time``.
"""

from __future__ import annotations

import re

import httpx

from core.errors import ProviderConfigError
from providers.base import (
    CancelsJobs,
    CannotCheck,
    Capabilities,
    ChecksCredential,
    DescribesJobs,
    ImageRequest,
    ImageResult,
    RemoteJobFailed,
    UnknownOutcome,
)
from providers.bounded_http import MAX_BYTES, MAX_REPLY_BYTES, describe
from providers.input_check import check_inputs, request_properties
from providers.jobs_api import JobsApiClient, NotYet, compute_us_of, read_json
from providers.profiles import Profile
from providers.replicate import model_input

QUEUE = "https://queue.fal.run"
# One endpoint's OpenAPI document (``?endpoint_id=fal-ai/flux/dev``), public and free
OPENAPI = "https://fal.ai/api/openapi/queue/openapi.json"
_REQUEST_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,127}")
_STATUSES = {"IN_QUEUE", "IN_PROGRESS", "COMPLETED"}
_CANCEL = {"OK", "CANCELLATION_REQUESTED", "ALREADY_COMPLETED", "NOT_FOUND"}


class FalProvider(JobsApiClient, CancelsJobs, DescribesJobs, ChecksCredential):
    KIND = "fal"
    AUTH_SCHEME = "Key"
    DEFAULT_BASE_URL = QUEUE

    @property
    def app(self) -> str:
        """Owner and app: the status, result and cancel URLs use no subpath."""
        return "/".join(self.model.split("/")[:2])

    def _capabilities(self, profile: Profile) -> Capabilities:
        return Capabilities(
            max_concurrency=profile.max_concurrency,
            supports_seed=profile.seed_input is not None,
            price=profile.pricing,
            can_lookup=False,
            idempotent_create=False,
        )

    def submit(self, request: ImageRequest) -> str:
        response = self._create(f"/{self.model}", model_input(self.profile, request))
        return self._created(response, "request_id", _REQUEST_ID, "request")

    def _collect_once(self, remote_ref: str) -> ImageResult:
        base = f"/{self.app}/requests/{remote_ref}"
        status = self._get_json(f"{base}/status", accept=(202,))
        state = status.get("status")
        if state != "COMPLETED":
            label = state if isinstance(state, str) and state in _STATUSES else "?"
            raise NotYet(f"status {label}", failed=False)
        if status.get("error") or status.get("error_type"):
            raise RemoteJobFailed("request failed", billed=False)  # fal bills successes only
        try:
            response = self._api.get(base)
        except httpx.HTTPError as exc:
            raise NotYet(f"result: {describe(exc)}") from None
        if response.status_code == 422 and self._has_detail(response):  # the model refused
            raise RemoteJobFailed("request failed: HTTP 422", billed=False)
        if not response.is_success:
            raise NotYet(f"result: HTTP {response.status_code}")
        try:
            result = read_json(response)
        except ValueError:
            raise NotYet("result: reply is not JSON") from None
        images = result.get("images") if isinstance(result, dict) else None
        first = images[0] if isinstance(images, list) and images else None
        url = first.get("url") if isinstance(first, dict) else None
        return self._fetch_output(url, compute_us=compute_us_of(status, "inference_time"))

    @staticmethod
    def _has_detail(response: httpx.Response) -> bool:
        try:
            body = read_json(response)
        except ValueError:
            return False
        return isinstance(body, dict) and "detail" in body

    def lookup(self, client_reference: str, request: ImageRequest | None = None) -> str | None:
        raise UnknownOutcome("lookup: fal's queue cannot find a request by anything we sent")

    def how_to_find(self, request: ImageRequest) -> str:
        """Where an operator finds a request whose submit reply was lost (fal requests carry
        nothing of ours): the app's request history, by the item's seed."""
        seed = f", seed {request.seed}" if self.profile.seed_input is not None else ""
        return f"a request to {self.model} (prompt of item {request.item_id}{seed})"

    def cancel(self, remote_ref: str) -> str:
        """Ask fal to cancel a queued or running request; the status it answers
        (``CANCELLATION_REQUESTED``, ``ALREADY_COMPLETED``, ...). Raises `UnknownOutcome`
        when the answer is not known."""
        if not _REQUEST_ID.fullmatch(remote_ref):
            raise UnknownOutcome("cancel: malformed request id")
        try:
            response = self._api.put(f"/{self.app}/requests/{remote_ref}/cancel")
            status = read_json(response).get("status") if response.status_code < 500 else None
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            raise UnknownOutcome(f"cancel: {describe(exc)}") from None
        if status not in _CANCEL:
            raise UnknownOutcome(f"cancel: HTTP {response.status_code}")
        return str(status)

    def check(self) -> str:
        """Verify the model and its inputs without spending: the endpoint's OpenAPI schema
        (``GET {schema_url}?endpoint_id={model}``, public: sent without the key) must exist
        and take every configured input name. fal documents no free call that verifies an
        ordinary key, so this ends in `CannotCheck` naming what was verified. Raises
        `ProviderConfigError` (no such endpoint, an unknown input) or `UnknownOutcome` (no
        answer)."""
        url = self.profile.schema_url or OPENAPI
        try:
            response = self._files.get(
                url,
                params={"endpoint_id": self.model},
                follow_redirects=False,
                extensions={MAX_BYTES: MAX_REPLY_BYTES},
            )
        except httpx.HTTPError as exc:
            raise UnknownOutcome(f"schema: {describe(exc)}") from None
        if response.status_code == 404:
            raise ProviderConfigError(
                f"profile {self.profile.id!r}: fal has no endpoint {self.model}"
            )
        try:
            schema = read_json(response) if response.status_code == 200 else None
        except ValueError:
            schema = None
        if not isinstance(schema, dict):
            raise UnknownOutcome(f"schema of {self.model}: HTTP {response.status_code}")
        properties = request_properties(schema, f"/{self.model}")
        if properties is None:
            raise UnknownOutcome(f"schema of {self.model}: no input schema for POST /{self.model}")
        names = check_inputs(self.profile, properties, f"endpoint {self.model}")
        raise CannotCheck(
            f"endpoint {self.model} takes every configured input ({', '.join(names)}); the "
            "key cannot be checked without spending (fal documents no free call that "
            "verifies one: the first paid submit does)"
        )
