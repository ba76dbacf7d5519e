"""A real HTTP provider for asynchronous submit/poll image APIs (shaped like Replicate's
predictions API): ``POST /predictions`` returns an id, ``GET /predictions/{id}`` polls it,
``GET /predictions?client_reference=...`` finds a job we sent, and the output is downloaded.

Every create carries an ``Idempotency-Key`` (the submission's client reference). Error mapping:

- not sent (connect error) or refused before acceptance (429, 5xx): transient, safe to retry;
- other 4xx: permanent;
- sent but no reply (read timeout, dropped connection): ``UnknownOutcome``: the job may exist,
  so the engine reconciles by client reference instead of sending it again.

Polls and downloads are free and are retried with tenacity on transient errors.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential_jitter

from providers.base import (
    Capabilities,
    ImageRequest,
    ImageResult,
    PermanentProviderError,
    RateLimited,
    StopCheck,
    Stopped,
    TransientProviderError,
    UnknownOutcome,
)
from providers.profiles import Profile

MAX_IMAGE_BYTES = 50 * 1024 * 1024


class HttpProvider:
    def __init__(
        self, *, profile: Profile, token: str, transport: httpx.BaseTransport | None = None
    ) -> None:
        assert profile.base_url is not None
        self.profile = profile
        self.capabilities = Capabilities(
            max_concurrency=profile.max_concurrency,
            supports_seed=True,
            cost_per_image_minor=profile.cost_per_image_minor,
            currency=profile.currency,
            can_lookup=True,
        )
        self._client = httpx.Client(
            base_url=profile.base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {token}", "User-Agent": "episodic"},
            timeout=httpx.Timeout(profile.timeout_s, connect=min(10.0, profile.timeout_s)),
            transport=transport,
            follow_redirects=False,
        )

    def submit(self, request: ImageRequest) -> str:
        body = {
            "input": {"prompt": request.prompt, "seed": request.seed},
            "client_reference": request.client_reference,
        }
        try:
            response = self._client.post(
                "/predictions", json=body, headers={"Idempotency-Key": request.client_reference}
            )
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            raise TransientProviderError(
                f"could not reach the provider: {type(exc).__name__}"
            ) from None
        except httpx.TransportError as exc:  # sent, but the reply never came
            raise UnknownOutcome(f"no reply to the create call: {type(exc).__name__}") from None
        _raise_for_status(response, "create")
        return _field(response, "id")

    def collect(self, remote_ref: str, *, deadline_s: float, should_stop: StopCheck) -> ImageResult:
        give_up = time.monotonic() + deadline_s
        while True:
            job = self._get_json(f"/predictions/{remote_ref}")
            status = job.get("status")
            if status == "succeeded":
                return self._download(job)
            if status in ("failed", "canceled"):
                raise PermanentProviderError(f"remote task {status}: {str(job.get('error'))[:200]}")
            if status not in ("starting", "processing"):
                raise PermanentProviderError(f"unexpected status {status!r}")
            if time.monotonic() > give_up:
                raise TransientProviderError(f"remote task {remote_ref} not done in time")
            for _ in range(max(1, int(self.profile.poll_interval_s / 0.05))):
                if should_stop():
                    raise Stopped()
                time.sleep(0.05)

    def lookup(self, client_reference: str) -> str | None:
        found = self._get_json("/predictions", params={"client_reference": client_reference})
        results = found.get("results")
        if not isinstance(results, list) or not results:
            return None
        first = results[0]
        return str(first["id"]) if isinstance(first, dict) and "id" in first else None

    def close(self) -> None:
        self._client.close()

    def _download(self, job: dict[str, Any]) -> ImageResult:
        output = job.get("output")
        url = output[0] if isinstance(output, list) and output else output
        if not isinstance(url, str):
            raise PermanentProviderError("succeeded task has no output URL")
        response = self._retrying(lambda: self._client.get(url))
        _raise_for_status(response, "download")
        content = response.content
        if not content or len(content) > MAX_IMAGE_BYTES:
            raise PermanentProviderError(f"output of {len(content)} bytes refused")
        media_type = response.headers.get("content-type", "application/octet-stream").split(";")[0]
        return ImageResult(content, media_type, self.capabilities.cost_per_image_minor)

    def _get_json(self, path: str, params: dict[str, str] | None = None) -> dict[str, Any]:
        response = self._retrying(lambda: self._client.get(path, params=params))
        _raise_for_status(response, "poll")
        try:
            data = response.json()
        except ValueError:
            raise TransientProviderError("provider sent a reply that is not JSON") from None
        if not isinstance(data, dict):
            raise PermanentProviderError("provider reply is not a JSON object")
        return data

    def _retrying(self, call: Any) -> httpx.Response:
        def attempt() -> httpx.Response:
            try:
                response: httpx.Response = call()
            except httpx.TransportError as exc:
                raise TransientProviderError(f"transport: {type(exc).__name__}") from None
            if response.status_code == 429 or response.status_code >= 500:
                raise TransientProviderError(f"HTTP {response.status_code}")
            return response

        retrying = Retrying(
            retry=retry_if_exception_type(TransientProviderError),
            stop=stop_after_attempt(5),
            wait=wait_exponential_jitter(multiplier=0.1, max=5.0),
            reraise=True,
        )
        return retrying(attempt)


def _raise_for_status(response: httpx.Response, what: str) -> None:
    code = response.status_code
    if code < 400:
        return
    if code == 429:
        raise RateLimited(f"{what}: HTTP 429 rate limited")
    if code >= 500:
        raise TransientProviderError(f"{what}: HTTP {code}")
    raise PermanentProviderError(f"{what}: HTTP {code}")  # body not echoed: it may hold secrets


def _field(response: httpx.Response, name: str) -> str:
    try:
        value = response.json()[name]
    except (ValueError, KeyError, TypeError):
        raise UnknownOutcome(f"create reply without {name!r}: acceptance unknown") from None
    if not isinstance(value, str) or not value or len(value) > 256:
        raise UnknownOutcome(f"create reply with a malformed {name!r}")
    return value
