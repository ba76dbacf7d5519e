"""What every asynchronous jobs API adapter shares (Replicate's, fal's and our own
``http`` protocol): submit once, poll until done, download the output.

Credentials go to the provider's origin only: the API client never follows redirects, a
``next`` link to another origin is refused, and outputs are downloaded by a second client that
carries no credential at all (pre-signed URLs, even on the provider's own origin). Error texts
carry a status or an exception type, never a response body nor the token.

A create is sent once (`JobsApiClient._create` never retries: the engine decides what may be
sent again); transport errors map by what they prove (``providers.base``)::

    create never sent      ConnectError, ConnectTimeout, PoolTimeout   TransientProviderError
                           LocalProtocolError, UnsupportedProtocol,
                           InvalidURL (e.g. an invalid header)         PermanentProviderError
    create sent, no reply  read/write timeout, dropped connection      UnknownOutcome

``collect`` polls until the deadline with tenacity: each adapter's ``_collect_once`` answers
the output, `RemoteJobFailed`, or `NotYet`; a job merely not done is polled again at
``poll_interval_s``, poll and download errors of any kind (transport, 5xx, 429, 401, 404, a
reply that is not a JSON object, a finished reply without a usable URL) with exponential
backoff, except a download refused (401/403: the output URL needs a credential or has
expired): after ``DOWNLOAD_REFUSALS`` of them (one fresh poll) ``CollectionPending`` at once,
naming the download's host, never its URL. A download answered 200 is returned whatever its
body (an empty one too): whether it is an image is the engine's to prove (``NotAnImage``:
downloaded again, then failed). Each retry polls again, so an expired pre-signed output URL
is replaced by a fresh one. At the deadline it raises ``CollectionPending`` (free to collect
later); an output larger than ``MAX_IMAGE_BYTES`` raises it at once.

A lookup believes only the reply (`JobsApiClient._find_one`): it keeps the listed jobs that
are ours by the reply's own fields (a server that ignores a filter cannot hand us another
item's job), follows at most ``MAX_LOOKUP_PAGES`` same-origin ``next`` links, and answers
``None`` (no such job), the id (exactly one) or ``UnknownOutcome`` (two jobs, an unusable
reply, any HTTP or transport error).
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from typing import Any

import httpx
from tenacity import RetryCallState, Retrying, retry_if_exception_type

from core.errors import ProviderConfigError
from core.pricing import MAX_QUANTITY, MILLION
from providers.base import (
    Capabilities,
    CollectionPending,
    ImageResult,
    PermanentProviderError,
    RateLimited,
    StopCheck,
    Stopped,
    TransientProviderError,
    UnknownOutcome,
)
from providers.bounded_http import MAX_REPLY_BYTES, bound, describe
from providers.profiles import Profile

MAX_IMAGE_BYTES = 50 * 1024 * 1024
MAX_LOOKUP_PAGES = 20
MAX_BACKOFF_S = 5.0
# A download answered 401/403 (the output URL wants a credential, or its signature expired):
# the first refusal polls again once, for a fresh URL; the second ends the collect at once
# (`CollectionPending`: paid, never bought again, collected by a later run) instead of
# retrying in silence until the collect deadline.
DOWNLOAD_REFUSALS = 2

_TOKEN = re.compile(r"[\x21-\x7e]+")  # printable ASCII: no whitespace, no control characters
JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:~-]{0,255}")  # safe as one URL path segment
STATUS_WORD = re.compile(r"[a-z_]{1,32}")  # a job status safe to repeat in a message
_NEVER_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
_NOT_SENDABLE = (httpx.LocalProtocolError, httpx.UnsupportedProtocol, httpx.InvalidURL)
_HTTP_FAILURES = (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError)


class NotYet(Exception):
    """This collect attempt did not get the output; ``failed``: an error, not just not done."""

    def __init__(self, reason: str, *, failed: bool = True) -> None:
        super().__init__(reason)
        self.failed = failed


class DownloadRefused(NotYet):
    """A download answered 401 or 403: no credential is ever sent there, so polling on
    will not change it, except once for a fresh (re-signed) output URL."""


class JobsApiClient:
    """The shared part of a jobs API adapter (the module docstring states its rules): the
    API client with the credential, the download client without it, the collect loop,
    capped downloads and same-origin pagination. Subclasses speak one API: they give
    ``KIND``, ``_capabilities``, ``submit``, ``lookup`` and ``_collect_once``."""

    AUTH_SCHEME = "Bearer"  # the Authorization header's scheme
    DEFAULT_BASE_URL: str | None = None

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
            raise UnknownOutcome(f"check: {describe(exc)}") from None
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

        def once(ref: str) -> ImageResult:
            nonlocal refusals
            try:
                return self._collect_once(ref)
            except DownloadRefused as exc:
                refusals += 1
                if refusals >= DOWNLOAD_REFUSALS:
                    raise CollectionPending(f"remote task {ref}: {exc}") from None
                raise

        try:
            return retrying(once, remote_ref)
        except NotYet as exc:
            raise CollectionPending(
                f"remote task {remote_ref} not collected within {deadline_s:g}s: {exc}"
            ) from None

    def _same_origin(self, page_url: httpx.URL, link: object) -> httpx.URL:
        """The next page's URL, only on the provider's origin (it gets the credential)."""
        try:
            target = page_url.join(link) if isinstance(link, str) else None
        except (httpx.InvalidURL, ValueError):  # ValueError: a host IDNA cannot encode
            target = None
        origin = self._origin
        if target is None or (target.scheme, target.host, target.port) != (
            origin.scheme,
            origin.host,
            origin.port,
        ):
            raise UnknownOutcome("lookup: next link is not on the provider's origin")
        return target

    def _find_one(
        self,
        path: str,
        params: dict[str, str],
        ours: Callable[[dict[str, Any]], bool],
        usable: re.Pattern[str],
        what: str,
    ) -> str | None:
        """The id of the one listed `what` for which `ours` holds, across same-origin
        ``next`` pages of ``{"results": [...]}``; None when there is none. `UnknownOutcome`
        when two match, a match has no `usable` id, the reply is unusable, or there are more
        than `MAX_LOOKUP_PAGES` pages: believed only from the reply, never from a filter."""
        found: set[str] = set()
        url: str | httpx.URL = path
        query: dict[str, str] | None = params
        for _ in range(MAX_LOOKUP_PAGES):
            page, page_url = self._lookup_page(url, query)
            results = page.get("results")
            if not isinstance(results, list):
                raise UnknownOutcome("lookup: reply without a results list")
            for entry in results:
                if isinstance(entry, dict) and ours(entry):
                    job_id = entry.get("id")
                    if not isinstance(job_id, str) or not usable.fullmatch(job_id):
                        raise UnknownOutcome(f"lookup: a {what} matching ours has no usable id")
                    found.add(job_id)
            link = page.get("next")
            if link is None or link == "":
                break
            url, query = self._same_origin(page_url, link), None
        else:
            raise UnknownOutcome(f"lookup: more than {MAX_LOOKUP_PAGES} pages of {what}s")
        if len(found) > 1:
            raise UnknownOutcome(f"lookup: {len(found)} {what}s match ours: ambiguous")
        return next(iter(found), None)

    def _lookup_page(
        self, url: str | httpx.URL, params: dict[str, str] | None
    ) -> tuple[dict[str, Any], httpx.URL]:
        try:
            response = self._api.get(url, params=params)
        except _HTTP_FAILURES as exc:
            raise UnknownOutcome(f"lookup: {describe(exc)}") from None
        if response.status_code != 200:
            raise UnknownOutcome(f"lookup: HTTP {response.status_code}")
        try:
            page = read_json(response)
        except ValueError:
            raise UnknownOutcome("lookup: reply is not JSON") from None
        if not isinstance(page, dict):
            raise UnknownOutcome("lookup: reply is not a JSON object")
        return page, response.request.url

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

    @staticmethod
    def _created(response: httpx.Response, field: str, usable: re.Pattern[str], what: str) -> str:
        """A create's reply for an API without idempotency keys, by what it proves: the new
        `what`'s id from `field` of a 2xx; 429 `RateLimited`; any other 4xx but 409
        `PermanentProviderError` (refused: no id); 409, 3xx, 5xx or a 2xx without a usable
        id `UnknownOutcome`."""
        code = response.status_code
        if response.is_success:
            try:
                made = read_json(response).get(field)
            except (ValueError, AttributeError):
                raise UnknownOutcome(f"create: HTTP {code} without a JSON object") from None
            if not isinstance(made, str) or not usable.fullmatch(made):
                raise UnknownOutcome(f"create: HTTP {code} without a valid {what} id")
            return made
        if code == 429:
            raise RateLimited("create: HTTP 429 throttled")
        if code == 409:
            raise UnknownOutcome(f"create: HTTP 409 (conflict): a {what} may exist")
        if 400 <= code < 500:  # a refusal document, no id: nothing was made
            raise PermanentProviderError(f"create refused: HTTP {code}")
        raise UnknownOutcome(f"create: HTTP {code}: a {what} may exist")

    def _get_json(self, path: str, *, accept: tuple[int, ...] = ()) -> dict[str, Any]:
        """A poll's JSON object, or `NotYet` (transport error, a status that is not 2xx nor
        in `accept`, a reply that is not a JSON object): polled again after a backoff."""
        try:
            response = self._api.get(path)
        except _HTTP_FAILURES as exc:
            raise NotYet(f"poll: {describe(exc)}") from None
        if not response.is_success and response.status_code not in accept:
            raise NotYet(f"poll: HTTP {response.status_code}")
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
                        f"download from {_host_of(response.request.url)} refused "
                        f"({response.status_code}): the output URL needs a credential or "
                        "has expired"
                    )
                if not response.is_success:
                    raise NotYet(f"download: HTTP {response.status_code}")
                content = _read_capped(response)
                media_type = response.headers.get("content-type", "application/octet-stream")
        except (*_HTTP_FAILURES, ValueError) as exc:  # ValueError: a host IDNA cannot encode
            raise NotYet(f"download: {describe(exc)}") from None
        # A 200 is the provider's answer, whatever its body: an empty one is not an image
        # (`pipeline.media.prove_image`), downloaded again and then failed with its charge,
        # never polled until the collect deadline as if the job were not done.
        return ImageResult(content, media_type.split(";")[0].strip(), reported_micros, compute_us)


def compute_us_of(job: dict[str, Any], field: str = "predict_time") -> int | None:
    """The job's compute time in microseconds, from ``metrics.<field>`` (seconds:
    ``predict_time`` as Replicate and our http protocol report it, ``inference_time`` in
    fal's COMPLETED status); None when absent, null, not a finite number in range (0 to
    `MAX_QUANTITY` microseconds; old Replicate replies carry negative figures) or a boolean.
    Exact: the number's own decimal digits, rounded up to a whole microsecond, never
    through float arithmetic."""
    metrics = job.get("metrics")
    value = metrics.get(field) if isinstance(metrics, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        seconds = Decimal(repr(value))
    except InvalidOperation:
        return None
    if not seconds.is_finite() or seconds < 0:
        return None
    micros = int((seconds * MILLION).to_integral_value(rounding=ROUND_CEILING))
    return micros if micros <= MAX_QUANTITY else None


def read_json(response: httpx.Response) -> Any:
    """The reply's JSON; any reply we cannot decode (not JSON, not UTF-8, an integer of
    thousands of digits, nesting deep enough to exhaust the parser's stack) is ValueError."""
    try:
        return response.json()
    except RecursionError:
        raise ValueError("reply nested too deeply") from None


def shown_status(status: object) -> str:
    """A job status as a message may show it: the word itself, or ``?`` when the reply's
    status is not a short lowercase word (it came from the provider: never echoed raw)."""
    return status if isinstance(status, str) and STATUS_WORD.fullmatch(status) else "?"


# Our own generator: the application's global `random` state stays its own.
_JITTER = random.Random()


def _backoff(interval: float, failures: int) -> float:
    """Exponential backoff with jitter after `failures` errors in a row, capped."""
    exponential: float = interval * 2.0 ** min(failures - 1, 16)
    return min(exponential + _JITTER.uniform(0, interval), MAX_BACKOFF_S)


def _host_of(url: httpx.URL) -> str:
    """Where a download went, as a message may show it: the host (and a port other than
    the scheme's), never the path nor the query (a pre-signed URL's signature)."""
    host = url.host if re.fullmatch(r"[A-Za-z0-9.:\[\]-]{1,253}", url.host or "") else "?"
    return f"{host}:{url.port}" if url.port is not None else host


def _read_capped(response: httpx.Response) -> bytes:
    declared = response.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > MAX_IMAGE_BYTES:
        raise CollectionPending(f"output of {declared} bytes refused (limit {MAX_IMAGE_BYTES})")
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_bytes():
        size += len(chunk)
        if size > MAX_IMAGE_BYTES:
            raise CollectionPending(f"output larger than {MAX_IMAGE_BYTES} bytes refused")
        chunks.append(chunk)
    return b"".join(chunks)
