"""Our own predictions protocol over HTTP (shaped like Replicate's): ``POST /predictions``
returns an ``id``, ``GET /predictions/{id}`` polls it, ``GET /predictions?client_reference=...``
finds a job we sent, and the output URL is downloaded (the shared client: `providers.jobs_api`).

Every create carries an ``Idempotency-Key`` (the submission's client reference) and is sent
once. A create's reply, by what it proves (``episodic.providers.base``; transport errors: see
``episodic.providers.jobs_api``)::

    429, or 503 with Retry-After (any value)    RateLimited (`jobs_api.throttle_of`)
    400, 401, 403, 404, 405, other 4xx          PermanentProviderError
    422 validation                              PermanentProviderError
    422 whose body mentions idempotency, 409    UnknownOutcome
    3xx, 5xx (502, 504, 503 without Retry-After) UnknownOutcome
    2xx without JSON or without a valid id      UnknownOutcome

A 503 with ``Retry-After`` is the server's "come back later": nothing was made, the create is
sent again after the wait (`episodic.pipeline.throttle`), by the rule every adapter reads a create's
reply with. A gateway in front of the server that made the job and then answered 503 with
``Retry-After`` breaks that promise: the create sent again carries the same
``Idempotency-Key``, so a server that honours it (``idempotent_create: true``) answers with the
job it made; one that does not would make a second. Such a server declares
``idempotent_create`` (and honours it), or its gateway sends no ``Retry-After`` after a create.

``collect``: ``succeeded`` is downloaded, ``failed`` and ``canceled`` raise
``RemoteJobFailed``; ``starting``, ``processing`` and any status we do not know are polled
again. What a job cost: the reply's ``cost_micros`` (an integer from 0 to
``MAX_IMAGE_COST_MICROS`` micro-units of the profile's currency; the older ``cost_minor``,
whole cents, still read) when present and in range, else the profile's price on its basis
(``metrics.predict_time``, seconds, is the compute time a per_second price is charged on);
a failed job is billed.

``lookup`` keeps the listed jobs whose ``client_reference`` equals ours exactly, never
trusting the server's filter.
"""

from __future__ import annotations

from typing import Any

import httpx

from episodic.core.money import MAX_IMAGE_COST_MICROS, MICROS_PER_MINOR
from episodic.core.provider_text import provider_words, refused_text
from episodic.providers.base import (
    Capabilities,
    ChecksCredential,
    ImageRequest,
    ImageResult,
    NotOurJob,
    PermanentProviderError,
    RecordedElsewhere,
    RemoteJobFailed,
    UnknownOutcome,
    VerifiesJobs,
)
from episodic.providers.bounded_http import reply_words
from episodic.providers.compute_time import compute_us_of
from episodic.providers.jobs_api import (
    JOB_ID,
    JobsApiClient,
    NotYet,
    read_json,
    shown_status,
    throttle_of,
)
from episodic.providers.profiles import Profile


class HttpProvider(JobsApiClient, ChecksCredential, VerifiesJobs):
    """Our own predictions protocol (see the module docstring)."""

    KIND = "http"

    def _capabilities(self, profile: Profile) -> Capabilities:
        return Capabilities(
            max_concurrency=profile.max_concurrency,
            supports_seed=True,
            price=profile.pricing,
            can_lookup=profile.lookup,
            idempotent_create=profile.idempotent_create,
        )

    def submit(self, request: ImageRequest) -> str:
        inputs: dict[str, Any] = {"prompt": request.prompt, "seed": request.seed}
        if request.reference_image is not None:
            inputs["reference_image"] = request.reference_image  # a data: URI
        body = {"input": inputs, "client_reference": request.client_reference}
        response = self._create(
            "/predictions", body, headers={"Idempotency-Key": request.client_reference}
        )
        return _created_id(response, self._secrets)

    def lookup(
        self,
        client_reference: str,
        request: ImageRequest | None = None,
        *,
        recorded: RecordedElsewhere | None = None,
    ) -> str | None:
        return self._find_one(
            "/predictions",
            {"client_reference": client_reference},
            lambda entry: entry.get("client_reference") == client_reference,
            JOB_ID,
            "job",
            recorded,
        )

    def verify_job(self, remote_ref: str, request: ImageRequest) -> str:
        """A job an operator found is this item's submission's when ``GET
        /predictions/{id}`` (free) answers it with our ``client_reference``."""
        if not JOB_ID.fullmatch(remote_ref):
            raise NotOurJob("not a job id")
        missing = f"the provider has no job {remote_ref}"
        job = self._read_free(f"/predictions/{remote_ref}", missing, f"job {remote_ref}")
        if job.get("client_reference") != request.client_reference:
            raise NotOurJob(f"job {remote_ref} carries another client reference")
        return f"job {remote_ref}: client reference {request.client_reference}"

    def check(self) -> str:
        """Verify the token without spending: a lookup of a reference no job has (``GET
        /predictions?client_reference=episodic-check``). Raises `ProviderConfigError` when
        the token is refused, `UnknownOutcome` when there is no usable answer."""
        response = self._verify("/predictions", {"client_reference": "episodic-check"})
        if response.status_code != 200:
            raise UnknownOutcome(f"check: HTTP {response.status_code}")
        return "the provider accepted the token (a free lookup)"

    def _collect_once(self, remote_ref: str) -> ImageResult:
        job = self._get_json(f"/predictions/{remote_ref}")
        status = job.get("status")
        if status in ("failed", "canceled"):
            said = provider_words(job.get("error"), secrets=self._secrets)
            raise RemoteJobFailed(
                f"remote task {status}" + (f": {said}" if said else ""),
                reported_micros=_reported(job),
                compute_us=compute_us_of(job),
            )
        if status != "succeeded":
            raise NotYet(f"status {shown_status(status)}", failed=False)
        output = job.get("output")
        url = output[0] if isinstance(output, list) and output else output
        return self._fetch_output(url, _reported(job), compute_us_of(job))


def _reported(job: dict[str, Any]) -> int | None:
    """The reply's own cost in micro-units (``cost_micros``, or the older ``cost_minor``),
    or None when it has none in range."""
    for field, scale in (("cost_micros", 1), ("cost_minor", MICROS_PER_MINOR)):
        cost = job.get(field)
        if isinstance(cost, int) and not isinstance(cost, bool) and cost >= 0:
            micros = cost * scale
            if micros <= MAX_IMAGE_COST_MICROS:
                return micros
    return None


def _created_id(response: httpx.Response, secrets: tuple[str, ...]) -> str:
    code = response.status_code
    if response.is_success:
        try:
            job_id = read_json(response).get("id")
        except (ValueError, AttributeError):
            raise UnknownOutcome(
                f"create: HTTP {code} without a JSON object: job unknown"
            ) from None
        if not isinstance(job_id, str) or not JOB_ID.fullmatch(job_id):
            raise UnknownOutcome(f"create: HTTP {code} without a valid id: job unknown")
        return job_id
    throttled = throttle_of(response, secrets)  # waited out for its Retry-After
    if throttled is not None:
        raise throttled
    if code == 422 and "idempot" in response.text.lower():
        raise UnknownOutcome("create: HTTP 422 (idempotency key in use): a job may exist")
    if code == 409:
        raise UnknownOutcome("create: HTTP 409 (conflict): a job may exist")
    if 400 <= code < 500:  # its words only, sanitized: the raw body may hold secrets
        said = reply_words(response, secrets)
        if code == 422:
            said = f"validation: {said}" if said else "validation"
        raise PermanentProviderError(refused_text(code, said), status=code)
    raise UnknownOutcome(f"create: HTTP {code}: a job may exist")
