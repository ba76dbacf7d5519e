"""Reading a provider's reply: its JSON, a job's status, a refusal's ``Retry-After``, a
download capped in size and named by its host only, as the jobs API adapters share them
(`providers.jobs_api`; a job's compute time is `providers.compute_time`, the provider's own
words `episodic.providers.bounded_http.reply_words`).

``Retry-After`` is parsed strictly (RFC 9110 section 10.2.3: delta-seconds or an IMF-fixdate
HTTP-date, anything else ignored). Replicate documents its 429 and the body it carries
(``{"detail": "Request was throttled. ..."}``) at
https://replicate.com/docs/topics/predictions/rate-limits.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

from episodic.providers.base import CollectionPending

STATUS_WORD = re.compile(r"[a-z_]{1,32}")  # a job status safe to repeat in a message
# The longest one wait a ``Retry-After`` is honoured for (seconds); a provider asking for
# more is waited this long at most (a poll) or pauses the run (a create: `pipeline.paid_call`).
MAX_RETRY_AFTER_S = 60.0
_DELTA_SECONDS = re.compile(r"[0-9]{1,10}")
_IMF_FIXDATE = re.compile(
    r"(Mon|Tue|Wed|Thu|Fri|Sat|Sun), [0-9]{2} "
    r"(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) [0-9]{4} [0-9]{2}:[0-9]{2}:[0-9]{2} GMT"
)


def retry_after(response: httpx.Response, now: datetime | None = None) -> float | None:
    """The reply's ``Retry-After`` in seconds from `now`, parsed strictly (RFC 9110 10.2.3):
    delta-seconds (digits only) or an IMF-fixdate (``Sun, 06 Nov 1994 08:49:37 GMT``; a date
    already past is 0). None when absent, repeated, or anything else (a negative or
    fractional number, another date format, text): the caller then backs off on its own."""
    values = response.headers.get_list("retry-after")
    if len(values) != 1:
        return None
    value = values[0].strip()
    if _DELTA_SECONDS.fullmatch(value):
        return float(int(value))
    if not _IMF_FIXDATE.fullmatch(value):
        return None
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):  # e.g. a day that does not exist
        return None
    now = now or datetime.now(UTC)
    return max(0.0, (when - now).total_seconds())


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


def host_of(url: httpx.URL) -> str:
    """Where a download went, as a message may show it: the host (and a port other than
    the scheme's), never the path nor the query (a pre-signed URL's signature)."""
    host = url.host if re.fullmatch(r"[A-Za-z0-9.:\[\]-]{1,253}", url.host or "") else "?"
    return f"{host}:{url.port}" if url.port is not None else host


def read_capped(response: httpx.Response, limit: int) -> bytes:
    """The reply's body, refused (`CollectionPending`) past `limit` bytes, declared or read."""
    declared = response.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise CollectionPending(f"output of {declared} bytes refused (limit {limit})")
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_bytes():
        size += len(chunk)
        if size > limit:
            raise CollectionPending(f"output larger than {limit} bytes refused")
        chunks.append(chunk)
    return b"".join(chunks)
