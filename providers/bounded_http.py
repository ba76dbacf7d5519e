"""Every reply a provider adapter reads is bounded in time and in size.

httpx's read timeout restarts at every byte: a server (or a proxy) that drips its reply a
byte at a time keeps a request waiting for as long as it likes, and a reply of any size is
read into memory. `bound(client, deadline_s, max_bytes)` installs event hooks on an
`httpx.Client` so that each response's body must be complete within `deadline_s` of the
request being sent (checked at every chunk, so a request ends within `deadline_s` plus at
most one read timeout), and at most `max_bytes` long (a larger declared Content-Length is
refused before reading). The failures are httpx errors, so every caller's existing handling
of a transport error applies: `ReplyTooSlow` is a read timeout, `ReplyTooLarge` a transport
error. A request may lower its cap with ``extensions={MAX_BYTES: n}``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from urllib.parse import quote

import httpx

from episodic.core.provider_text import problem_words, provider_words

MAX_REPLY_BYTES = 5 * 1024 * 1024  # a JSON reply: a job, a page of jobs, a model's schema
MAX_BYTES = "episodic_max_bytes"  # a request extension: this request's own cap
_STARTED = "episodic_started"


class ReplyTooSlow(httpx.ReadTimeout):
    """The reply did not arrive in full within the request's total deadline."""


class ReplyTooLarge(httpx.TransportError):
    """The reply is larger than the request may read."""


def describe(exc: Exception) -> str:
    """How a message names a transport failure: ours say what happened, httpx's by type."""
    return str(exc) if isinstance(exc, ReplyTooSlow | ReplyTooLarge) else type(exc).__name__


def reply_words(response: httpx.Response, secrets: Iterable[str]) -> str:
    """What a refusal's body says (its problem document's title and detail, `problem_words`:
    bounded, one printable line, `secrets` struck out); "" when it says nothing readable."""
    try:
        body = response.json()
    except (ValueError, RecursionError, httpx.HTTPError):
        return ""
    return problem_words(body, secrets=secrets)


def shown_url(url: httpx.URL | str, *, secrets: Iterable[str]) -> str:
    """Where a request went, as a message may show it: scheme, host, port and path, never a
    user, password or query (a credential or a signature may ride there); at most 200
    characters of printable ASCII. A path is text the profile wrote (its ``base_url``) and
    may hold the token itself (a gateway-style URL): every one of `secrets` (as written and
    percent-encoded) and anything shaped like a credential is struck (`provider_words`)."""
    try:
        parsed = url if isinstance(url, httpx.URL) else httpx.URL(url)
        port = f":{parsed.port}" if parsed.port is not None else ""
        text = f"{parsed.scheme}://{parsed.host}{port}{parsed.path}"
    except (httpx.InvalidURL, ValueError, TypeError):
        return "?"
    text = "".join(c if "!" <= c <= "~" else "?" for c in text)
    struck = [quote(secret, safe="") for secret in secrets] + list(secrets)
    return provider_words(text, secrets=sorted(struck, key=len, reverse=True), limit=200)


def unreached(exc: httpx.HTTPError, fallback: httpx.URL | str, *, secrets: Iterable[str]) -> str:
    """A transport failure that names the URL it could not reach: ``could not reach
    http://host:port/path (ConnectError)``, the profile's `secrets` struck from it."""
    try:
        url: httpx.URL | str = exc.request.url
    except RuntimeError:  # an error raised before a request was attached
        url = fallback
    return f"could not reach {shown_url(url, secrets=secrets)} ({describe(exc)})"


def bound(client: httpx.Client, deadline_s: float, max_bytes: int) -> httpx.Client:
    """`client`, each of its replies bounded to `deadline_s` in all and `max_bytes`."""

    def started(request: httpx.Request) -> None:
        request.extensions[_STARTED] = time.monotonic()

    def bounded(response: httpx.Response) -> None:
        request = response.request
        limit = min(max_bytes, int(request.extensions.get(MAX_BYTES, max_bytes)))
        declared = response.headers.get("content-length", "")
        if declared.isascii() and declared.isdigit() and int(declared) > limit:
            response.close()
            raise ReplyTooLarge(
                f"a reply of {declared} bytes refused (limit {limit})", request=request
            )
        deadline = float(request.extensions.get(_STARTED, time.monotonic())) + deadline_s
        response.stream = _Bounded(response.stream, request, deadline, deadline_s, limit)

    client.event_hooks["request"].append(started)
    client.event_hooks["response"].append(bounded)
    return client


class _Bounded(httpx.SyncByteStream):
    def __init__(
        self,
        inner: httpx.SyncByteStream | httpx.AsyncByteStream,
        request: httpx.Request,
        deadline: float,
        deadline_s: float,
        limit: int,
    ) -> None:
        self._inner = inner
        self._request = request
        self._deadline = deadline
        self._deadline_s = deadline_s
        self._limit = limit

    def __iter__(self) -> Iterator[bytes]:
        size = 0
        assert isinstance(self._inner, httpx.SyncByteStream)
        for chunk in self._inner:
            size += len(chunk)
            if size > self._limit:
                raise ReplyTooLarge(
                    f"a reply larger than {self._limit} bytes refused", request=self._request
                )
            if time.monotonic() > self._deadline:
                raise ReplyTooSlow(
                    f"no complete reply within {self._deadline_s:g} s", request=self._request
                )
            yield chunk

    def close(self) -> None:
        if isinstance(self._inner, httpx.SyncByteStream):
            self._inner.close()
