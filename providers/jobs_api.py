"""What every asynchronous jobs API adapter shares (Replicate's, fal's and our own
``http`` protocol): submit once, poll until done, download the output.

Credentials go to the provider's origin only: the API client never follows redirects, a
``next`` link to another origin is refused, and outputs are downloaded by a second client that
carries no credential at all (pre-signed URLs, even on the provider's own origin). Error texts
carry a status or an exception type, and the provider's own words (`episodic.core.provider_text`:
bounded, printable, the token struck out); never a raw response body nor the token.

A create is sent once (`JobsApiClient._create` never retries: the engine decides what may be
sent again); transport errors map by what they prove (``episodic.providers.base``)::

    create never sent      ConnectError, ConnectTimeout, PoolTimeout   TransientProviderError
                           LocalProtocolError, UnsupportedProtocol,
                           InvalidURL (e.g. an invalid header)         PermanentProviderError
    create sent, no reply  read/write timeout, dropped connection      UnknownOutcome

``collect`` polls until the deadline with tenacity: each adapter's ``_collect_once`` answers
the output, `RemoteJobFailed`, `OutputGone` (the reply itself says the output was removed),
or `NotYet`; a job merely not done is polled again at
``poll_interval_s``, poll and download errors of any kind (transport, 5xx, 429, 401, 404, a
reply that is not a JSON object, a finished reply without a usable URL) with exponential
backoff, except a download refused (401/403: the output URL needs a credential or has
expired): after ``DOWNLOAD_REFUSALS`` of them (one fresh poll) ``CollectionPending`` at once,
naming the download's host, never its URL; on an adapter whose provider deletes outputs
(``GONE_AFTER_MISSES``), that many downloads answered 404/410 in a row, each after a fresh
poll, are `OutputGone` at once (the job was paid; its output will never come back). A poll
answered 429 or 503 waits its ``Retry-After`` (at most ``MAX_RETRY_AFTER_S``, within the
deadline). A download answered 200 is returned whatever its
body (an empty one too): whether it is an image is the engine's to prove (``NotAnImage``:
downloaded again, then failed). Each retry polls again, so an expired pre-signed output URL
is replaced by a fresh one. At the deadline it raises ``CollectionPending`` (free to collect
later); an output larger than ``MAX_IMAGE_BYTES`` raises it at once.

A create answered 429, or 503 with a ``Retry-After`` header of any value, made nothing:
`RateLimited` with the wait (None when the value is not a form `episodic.providers.replies` accepts:
the caller backs off briefly) and the provider's words (`pipeline.paid_call`). A 503 is "the
server is currently unable to handle the request ... The server MAY send a Retry-After header
field to suggest an appropriate amount of time for the client to wait before retrying"
(RFC 9110 section 15.6.4, https://www.rfc-editor.org/rfc/rfc9110#section-15.6.4): with the
header it is the provider's "come back later"; a 503 without it stays an unknown outcome.
Every adapter reads a create's reply by this one rule (`throttle_of`). A gateway that made the
job and then answered 503 with ``Retry-After`` would break it: the create sent again after the
wait is the same call (the http adapter's carries the same ``Idempotency-Key``, so a provider
that honours it, ``idempotent_create``, answers with the job it made instead of a second).

A lookup believes only the reply (`episodic.providers.lookups.FindsJobs`, the client's lookup half):
``None`` (no such job), the id (exactly one, never one the ledger records for another
submission) or ``UnknownOutcome`` (`AmbiguousLookup`: two remain; an unusable reply, any
HTTP or transport error).
"""

from __future__ import annotations

import random
import re
import time
from typing import Any

import httpx
from tenacity import RetryCallState, Retrying, retry_if_exception_type

from episodic.core.errors import ProviderConfigError
from episodic.core.provider_text import refused_text
from episodic.providers.base import (
    Capabilities,
    CollectionPending,
    ImageResult,
    NotOurJob,
    OutputGone,
    PermanentProviderError,
    RateLimited,
    StopCheck,
    Stopped,
    TransientProviderError,
    UnknownOutcome,
)
from episodic.providers.bounded_http import MAX_REPLY_BYTES, bound, describe, reply_words, unreached
from episodic.providers.compute_time import compute_us_of as compute_us_of  # its adapters' import
from episodic.providers.lookups import FindsJobs
from episodic.providers.profiles import Profile
from episodic.providers.replies import MAX_RETRY_AFTER_S, host_of, read_capped
from episodic.providers.replies import STATUS_WORD as STATUS_WORD  # (re-exported, as the others)
from episodic.providers.replies import read_json as read_json
from episodic.providers.replies import retry_after as retry_after
from episodic.providers.replies import shown_status as shown_status

MAX_IMAGE_BYTES = 50 * 1024 * 1024
MAX_BACKOFF_S = 5.0
# Downloads answered 401/403 before the collect ends (`CollectionPending`), one fresh poll
# between: the output URL wants a credential, or its signature expired (module docstring).
DOWNLOAD_REFUSALS = 2
_TOKEN = re.compile(r"[\x21-\x7e]+")  # printable ASCII: no whitespace, no control characters
JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:~-]{0,255}")  # safe as one URL path segment
_NEVER_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
_NOT_SENDABLE = (httpx.LocalProtocolError, httpx.UnsupportedProtocol, httpx.InvalidURL)
_HTTP_FAILURES = (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError)


class NotYet(Exception):
    """This collect attempt did not get the output; ``failed``: an error, not just not done;
    ``retry_after_s``: the provider asked us to wait this long before asking again."""

    def __init__(
        self, reason: str, *, failed: bool = True, retry_after_s: float | None = None
    ) -> None:
        super().__init__(reason)
        self.failed = failed
        self.retry_after_s = retry_after_s


class DownloadMissing(NotYet):
    """A download answered 404 or 410: the output URL names nothing any more (deleted after
    the provider's retention), unless a fresh poll gives another URL."""

    def __init__(self, reason: str, *, compute_us: int | None = None) -> None:
        super().__init__(reason)
        self.compute_us = compute_us


class DownloadRefused(NotYet):
    """A download answered 401 or 403: no credential is ever sent there, so polling on
    will not change it, except once for a fresh (re-signed) output URL."""


class JobsApiClient(FindsJobs):
    """The shared part of a jobs API adapter (the module docstring states its rules): the
    API client with the credential, the download client without it, the collect loop,
    capped downloads and same-origin pagination. Subclasses speak one API: they give
    ``KIND``, ``_capabilities``, ``submit``, ``lookup`` and ``_collect_once``."""

    AUTH_SCHEME = "Bearer"  # the Authorization header's scheme
    DEFAULT_BASE_URL: str | None = None
    # Downloads answered 404/410 in a row, each after a fresh poll, that prove the output
    # deleted (`OutputGone`); None: the provider documents no deletion, ridden out.
    GONE_AFTER_MISSES: int | None = None

    def __init__(
        self,
        *,
        profile: Profile,
        token: str,
        transport: httpx.BaseTransport | None = None,
        download_transport: httpx.BaseTransport | None = None,
    ) -> None:
        base_url = profile.base_url or self.DEFAULT_BASE_URL
        if base_url is None:
            raise ProviderConfigError(f"{profile.kind} profile {profile.id!r} needs base_url")
        self._check_profile(profile)
        if not _TOKEN.fullmatch(token):  # never echoed: it is the credential
            raise ProviderConfigError(
                f"credential for profile {profile.id!r} is not a usable API token "
                "(empty, or holds whitespace, control or non-ASCII characters)"
            )
        self.profile = profile
        self._secrets = (token,)  # struck from any provider text a message shows
        self.capabilities = self._capabilities(profile)
        timeout = httpx.Timeout(profile.timeout_s, connect=min(10.0, profile.timeout_s))
        try:
            self._origin = httpx.URL(base_url)
            self._api = bound(
                httpx.Client(
                    base_url=base_url.rstrip("/"),
                    headers={
                        "Authorization": f"{self.AUTH_SCHEME} {token}",
                        "User-Agent": "episodic",
                    },
                    timeout=timeout,
                    transport=transport,
                    follow_redirects=False,
                ),
                profile.timeout_s,
                MAX_REPLY_BYTES,
            )
        except httpx.InvalidURL:
            raise ProviderConfigError(f"profile {profile.id!r}: invalid base_url") from None
        self._files = bound(  # no credential: outputs are public or pre-signed URLs
            httpx.Client(
                headers={"User-Agent": "episodic"},
                timeout=timeout,
                transport=download_transport,
                follow_redirects=True,
            ),
            profile.timeout_s,
            MAX_IMAGE_BYTES,
        )

    KIND: str | None = None  # the profile kind this adapter serves (None: any)

    def _check_profile(self, profile: Profile) -> None:
        """Refuse a profile of another kind (`ProviderConfigError`); the profile's own
        validation already refused what does not fit its kind (a missing model, ...)."""
        if self.KIND is not None and profile.kind != self.KIND:
            raise ProviderConfigError(f"profile {profile.id!r} is not a {self.KIND} profile")

    @property
    def model(self) -> str:
        return self.profile.model or ""

    def _verify(self, path: str, params: dict[str, str] | None = None) -> httpx.Response:
        """A free call that proves the token: the reply, or `ProviderConfigError` (refused,
        401/403) or `UnknownOutcome` (no reply)."""
        try:
            response = self._api.get(path, params=params)
        except httpx.HTTPError as exc:
            raise UnknownOutcome(
                unreached(exc, f"{self._api.base_url}{path}", secrets=self._secrets)
            ) from None
        if response.status_code in (401, 403):
            raise ProviderConfigError(
                f"profile {self.profile.id!r}: the provider refused the token (HTTP "
                f"{response.status_code})"
            )
        return response

    def _capabilities(self, profile: Profile) -> Capabilities:
        raise NotImplementedError

    def collect(self, remote_ref: str, *, deadline_s: float, should_stop: StopCheck) -> ImageResult:
        if not JOB_ID.fullmatch(remote_ref):
            raise CollectionPending("malformed remote task reference")
        give_up = time.monotonic() + deadline_s
        interval = self.profile.poll_interval_s
        failures = 0  # in a row: a job that is merely not done is polled at the interval

        def wait(state: RetryCallState) -> float:
            nonlocal failures
            error = state.outcome.exception() if state.outcome else None
            failures = failures + 1 if isinstance(error, NotYet) and error.failed else 0
            seconds = _backoff(interval, failures) if failures else interval
            asked = getattr(error, "retry_after_s", None)
            if asked is not None:  # the provider said when: never sooner, at most the bound
                seconds = max(seconds, min(asked, MAX_RETRY_AFTER_S))
            return max(0.0, min(seconds, give_up - time.monotonic()))

        def sleep(seconds: float) -> None:
            until = time.monotonic() + seconds
            while True:
                if should_stop():
                    raise Stopped()
                left = until - time.monotonic()
                if left <= 0:
                    return
                time.sleep(min(left, 0.05))

        retrying = Retrying(
            retry=retry_if_exception_type(NotYet),
            stop=lambda _state: time.monotonic() >= give_up,
            wait=wait,
            sleep=sleep,
            reraise=True,
        )
        refusals = 0
        misses = 0  # in a row, each after a fresh poll

        def once(ref: str) -> ImageResult:
            nonlocal refusals, misses
            try:
                return self._collect_once(ref)
            except DownloadRefused as exc:
                refusals += 1
                misses = 0
                if refusals >= DOWNLOAD_REFUSALS:
                    raise CollectionPending(f"remote task {ref}: {exc}") from None
                raise
            except DownloadMissing as exc:
                misses += 1
                if self.GONE_AFTER_MISSES is not None and misses >= self.GONE_AFTER_MISSES:
                    raise OutputGone(
                        f"remote task {ref}: output gone at the provider ({exc}, again after "
                        "a fresh poll)",
                        compute_us=exc.compute_us,
                    ) from None
                raise
            except NotYet:
                misses = 0
                raise

        try:
            return retrying(once, remote_ref)
        except NotYet as exc:
            raise CollectionPending(
                f"remote task {remote_ref} not collected within {deadline_s:g}s: {exc}"
            ) from None

    def _collect_once(self, remote_ref: str) -> ImageResult:
        """One poll: the output, or `NotYet` (polled again), or `RemoteJobFailed`."""
        raise NotImplementedError

    def close(self) -> None:
        self._api.close()
        self._files.close()

    def _create(
        self, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> httpx.Response:
        """POST a create once (never retried here); transport errors by what they prove."""
        try:
            return self._api.post(path, json=body, headers=headers)
        except _NEVER_SENT as exc:
            raise TransientProviderError(f"create not sent: {describe(exc)}") from None
        except _NOT_SENDABLE as exc:
            raise PermanentProviderError(f"create not sent: {describe(exc)}") from None
        except httpx.HTTPError as exc:  # the request may have left the machine
            raise UnknownOutcome(f"create sent, no reply: {describe(exc)}") from None

    def _created(
        self, response: httpx.Response, field: str, usable: re.Pattern[str], what: str
    ) -> str:
        """A create's reply for an API without idempotency keys, by what it proves: the new
        `what`'s id from `field` of a 2xx; 429, or 503 with ``Retry-After``, `RateLimited`;
        any other 4xx but 409 `PermanentProviderError` (refused: no id; the provider's
        words); 409, 3xx, 5xx or a 2xx without a usable id `UnknownOutcome`."""
        code = response.status_code
        if response.is_success:
            try:
                made = read_json(response).get(field)
            except (ValueError, AttributeError):
                raise UnknownOutcome(f"create: HTTP {code} without a JSON object") from None
            if not isinstance(made, str) or not usable.fullmatch(made):
                raise UnknownOutcome(f"create: HTTP {code} without a valid {what} id")
            return made
        throttled = throttle_of(response, self._secrets)
        if throttled is not None:
            raise throttled
        if code == 409:
            raise UnknownOutcome(f"create: HTTP 409 (conflict): a {what} may exist")
        if 400 <= code < 500:  # a refusal document, no id: nothing was made
            said = reply_words(response, self._secrets)
            raise PermanentProviderError(refused_text(code, said), status=code)
        raise UnknownOutcome(f"create: HTTP {code}: a {what} may exist")

    def _read_free(self, path: str, missing: str, what: str) -> dict[str, Any]:
        """A free GET of one job (an operator's job to verify): its JSON object. Raises
        `NotOurJob` with `missing` on 404, `UnknownOutcome` on no reply (naming the URL) or
        any other answer that is not a JSON object (`what` names the job in it)."""
        try:
            response = self._api.get(path)
        except httpx.HTTPError as exc:
            raise UnknownOutcome(
                unreached(exc, f"{self._api.base_url}{path}", secrets=self._secrets)
            ) from None
        if response.status_code == 404:
            raise NotOurJob(missing)
        try:
            body = read_json(response) if response.is_success else None
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise UnknownOutcome(f"{what}: HTTP {response.status_code}")
        return body

    def _get_json(self, path: str, *, accept: tuple[int, ...] = ()) -> dict[str, Any]:
        """A poll's JSON object, or `NotYet` (transport error, a status that is not 2xx nor
        in `accept`, a reply that is not a JSON object): polled again after a backoff."""
        try:
            response = self._api.get(path)
        except _HTTP_FAILURES as exc:
            raise NotYet(f"poll: {describe(exc)}") from None
        if not response.is_success and response.status_code not in accept:
            raise NotYet(
                f"poll: HTTP {response.status_code}",
                retry_after_s=retry_after(response) if response.status_code in (429, 503) else None,
            )
        try:
            job = read_json(response)
        except ValueError:
            raise NotYet("poll: reply is not JSON") from None
        if not isinstance(job, dict):
            raise NotYet("poll: reply is not a JSON object")
        return job

    def _fetch_output(
        self, url: object, reported_micros: int | None = None, compute_us: int | None = None
    ) -> ImageResult:
        """Download an output over the client without the credential, capped in size."""
        if not isinstance(url, str) or not url.lower().startswith(("http://", "https://")):
            raise NotYet("finished reply without an http(s) output URL")
        try:
            with self._files.stream("GET", url) as response:
                if response.status_code in (401, 403):
                    raise DownloadRefused(
                        f"download from {host_of(response.request.url)} refused "
                        f"({response.status_code}): the output URL needs a credential or "
                        "has expired"
                    )
                if response.status_code in (404, 410):
                    raise DownloadMissing(
                        f"download from {host_of(response.request.url)}: HTTP "
                        f"{response.status_code}",
                        compute_us=compute_us,
                    )
                if not response.is_success:
                    raise NotYet(f"download: HTTP {response.status_code}")
                content = read_capped(response, MAX_IMAGE_BYTES)
                media_type = response.headers.get("content-type", "application/octet-stream")
        except (*_HTTP_FAILURES, ValueError) as exc:  # ValueError: a host IDNA cannot encode
            raise NotYet(f"download: {describe(exc)}") from None
        # A 200 is the provider's answer, whatever its body: an empty one is not an image
        # (`episodic.pipeline.media.prove_image`), downloaded again and then failed with its charge,
        # never polled until the collect deadline as if the job were not done.
        return ImageResult(content, media_type.split(";")[0].strip(), reported_micros, compute_us)


def throttle_of(response: httpx.Response, secrets: tuple[str, ...]) -> RateLimited | None:
    """The `RateLimited` a create's reply proves, or None: 429, or 503 with a ``Retry-After``
    of any value (the module docstring's rule, every adapter's), with the wait it asked for
    (None: a value `episodic.providers.replies` does not accept, a short backoff) and its words."""
    code = response.status_code
    if not (code == 429 or (code == 503 and "retry-after" in response.headers)):
        return None
    said = reply_words(response, secrets)
    return RateLimited(
        f"create: HTTP {code} throttled" + (f": {said}" if said else ""),
        retry_after_s=retry_after(response),
        detail=said,
    )


# Our own generator: the application's global `random` state stays its own.
_JITTER = random.Random()


def _backoff(interval: float, failures: int) -> float:
    """Exponential backoff with jitter after `failures` errors in a row, capped."""
    exponential: float = interval * 2.0 ** min(failures - 1, 16)
    return min(exponential + _JITTER.uniform(0, interval), MAX_BACKOFF_S)
