"""fal.ai's queue API (https://docs.fal.ai/model-endpoints/queue), as it documents it.

- **Submit** ``POST https://queue.fal.run/{model}`` (``model`` may have a subpath, e.g.
  ``fal-ai/flux/dev``) with the model's input as the body; ``Authorization: Key <key>``; the
  reply's ``request_id`` is the job. fal documents **no idempotency key** and **no way to
  find a request by anything we send**: the queue has no listing, so an unknown outcome is
  left to an operator (the adapter declares neither capability, and never sends again).
- **Collect**: the status, result and cancel URLs use the owner and app only, without the
  subpath (``fal-ai/flux/requests/{id}/status``). ``IN_QUEUE`` and ``IN_PROGRESS`` (HTTP 202)
  are polled again; ``COMPLETED`` with ``error`` or ``error_type`` is a failed request
  (its ``error`` text in the message, sanitized: `episodic.core.provider_text`);
  otherwise the result ``GET .../requests/{id}`` holds ``images: [{url, ...}]``, downloaded
  without the credential (fal's CDN). A result answered 422 with a ``detail`` (the model's
  validation or content error) is a failed request too, its ``detail`` in the message;
  any other error is polled again,
  but a result answered 404 after a COMPLETED status, twice in a row (a fresh status poll
  between), is `OutputGone`: "fal keeps the result for 1 hour after the request completes"
  (6 minutes for a result of 10 KB or more; https://fal.ai/docs/inference-api/queue/result),
  and the media on fal's CDN lives as long as the request's
  ``X-Fal-Object-Lifecycle-Preference`` says (https://fal.ai/docs/model-apis/data-retention):
  a delivery answered 404 again after a fresh poll is `OutputGone` too (`providers.jobs_api`).
  `episodic.providers.retention` (the result's hour) is what `runs show` tells an operator.
  The COMPLETED status carries ``metrics.inference_time`` ("Seconds the runner spent
  processing (only when COMPLETED)", https://docs.fal.ai/documentation/model-apis/inference/queue;
  legacy apps may send none): the compute time a per_second price is charged on.
- **Verify** a request an operator found (``episodic runs adopt``): its status (the app
  knows it, COMPLETED without error) and its result's echo of the seed and prompt.
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
from typing import Any

import httpx

from episodic.core.errors import ProviderConfigError
from episodic.core.provider_text import provider_words, result_refused_text
from episodic.providers.base import (
    CancelsJobs,
    CannotCheck,
    Capabilities,
    ChecksCredential,
    DescribesJobs,
    ImageRequest,
    ImageResult,
    NotOurJob,
    RecordedElsewhere,
    RemoteJobFailed,
    UnknownOutcome,
    VerifiesJobs,
)
from episodic.providers.bounded_http import (
    MAX_BYTES,
    MAX_REPLY_BYTES,
    describe,
    reply_words,
    unreached,
)
from episodic.providers.compute_time import compute_us_of
from episodic.providers.input_check import check_inputs, request_properties
from episodic.providers.jobs_api import DownloadMissing, JobsApiClient, NotYet, read_json
from episodic.providers.profiles import Profile
from episodic.providers.replicate import model_input

QUEUE = "https://queue.fal.run"
# One endpoint's OpenAPI document (``?endpoint_id=fal-ai/flux/dev``), public and free
OPENAPI = "https://fal.ai/api/openapi/queue/openapi.json"
_REQUEST_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,127}")
_STATUSES = {"IN_QUEUE", "IN_PROGRESS", "COMPLETED"}
_CANCEL = {"OK", "CANCELLATION_REQUESTED", "ALREADY_COMPLETED", "NOT_FOUND"}


class FalProvider(JobsApiClient, CancelsJobs, DescribesJobs, ChecksCredential, VerifiesJobs):
    KIND = "fal"
    AUTH_SCHEME = "Key"
    DEFAULT_BASE_URL = QUEUE
    GONE_AFTER_MISSES = 2  # its outputs are deleted after an hour (module docstring)

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
            said = provider_words(
                status.get("error") or status.get("error_type"), secrets=self._secrets
            )
            raise RemoteJobFailed(  # fal bills successes only
                "request failed" + (f": {said}" if said else ""), billed=False
            )
        try:
            response = self._api.get(base)
        except httpx.HTTPError as exc:
            raise NotYet(f"result: {describe(exc)}") from None
        if response.status_code == 422 and self._has_detail(response):  # the model refused
            said = reply_words(response, self._secrets)
            raise RemoteJobFailed(result_refused_text(422, said), billed=False)
        if response.status_code in (404, 410):  # COMPLETED, yet no result: kept an hour only
            raise DownloadMissing(
                f"result: HTTP {response.status_code}",
                compute_us=compute_us_of(status, "inference_time"),
            )
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

    def lookup(
        self,
        client_reference: str,
        request: ImageRequest | None = None,
        *,
        recorded: RecordedElsewhere | None = None,
    ) -> str | None:
        raise UnknownOutcome("lookup: fal's queue cannot find a request by anything we sent")

    def verify_job(self, remote_ref: str, request: ImageRequest) -> str:
        """A request an operator found (fal's request history) is this item's only when the
        app's queue knows it (``GET .../requests/{id}/status``: the app, not the endpoint's
        subpath, is what the URL proves), it completed without an error, and its result
        echoes the item's ``seed`` (and ``prompt``, where the model echoes it, as FLUX
        does). fal's queue shows a request's input nowhere else: a request still queued or
        running, or a model whose result echoes neither, cannot be verified and is refused;
        a failed request has nothing to collect (and fal does not bill it)."""
        if not _REQUEST_ID.fullmatch(remote_ref):
            raise NotOurJob(f"{provider_words(remote_ref, limit=80)!r} is not a fal request id")
        base = f"/{self.app}/requests/{remote_ref}"
        status = self._read(f"{base}/status", remote_ref)
        state = status.get("status")
        if state != "COMPLETED":
            label = state if isinstance(state, str) and state in _STATUSES else "?"
            raise NotOurJob(
                f"request {remote_ref} is {label}: fal shows a request's input only in its "
                "result (the seed it echoes); adopt it once it completed"
            )
        if status.get("error") or status.get("error_type"):
            raise NotOurJob(f"request {remote_ref} failed at fal: nothing to collect (not billed)")
        result = self._read(base, remote_ref)
        checked = []
        if self.profile.seed_input is not None and "seed" in result:
            if result.get("seed") != request.seed:
                raise NotOurJob(f"request {remote_ref}'s seed is not item {request.item_id}'s")
            checked.append(f"seed {request.seed}")
        if "prompt" in result:
            if result.get("prompt") != request.prompt:
                raise NotOurJob(f"request {remote_ref}'s prompt is not item {request.item_id}'s")
            checked.append("the item's prompt")
        if not checked:
            raise NotOurJob(
                f"request {remote_ref}'s result echoes neither the seed nor the prompt: it "
                "cannot be verified as this item's"
            )
        return f"request {remote_ref} to {self.app}: {', '.join(checked)}"

    def _read(self, path: str, remote_ref: str) -> dict[str, Any]:
        """A free GET of a request's status or result: its JSON object; 404 `NotOurJob`."""
        missing = f"fal has no request {remote_ref} of {self.app} for this key"
        return self._read_free(path, missing, f"request {remote_ref}")

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
            raise UnknownOutcome(f"schema: {unreached(exc, url, secrets=self._secrets)}") from None
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
