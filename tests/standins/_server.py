"""What the Replicate and fal stand-ins share: two real HTTP origins, the stand-in's own clock,
the faults a test arms on the next creates, the provider-side counters, and the pictures.

Each stand-in runs two stdlib ``ThreadingHTTPServer`` origins on loopback, port 0: the **API**
(127.0.0.1, every request needs the credential) and the **delivery** origin (127.0.0.2 where
it can be bound, else 127.0.0.1 on another port: another origin either way), which serves the
outputs without any credential, as ``replicate.delivery`` and ``v3.fal.media`` do. Every
request either origin sees is recorded (`Seen`); ``credential_reached_delivery`` says whether
a credential ever arrived at the delivery origin.

Time: retention windows run on the stand-in's own `Clock`, which a test moves with
``advance(seconds)``; nothing in a stand-in waits on the wall clock except a ``Prefer: wait``
hold, which is bounded by ``max_hold_s`` (0 by default: the reply comes at once).

Faults a test arms (`Faults`), each for the next ``n`` creates, in the order armed:
``throttle(n, retry_after=k)`` (429 with ``Retry-After: k``, nothing made),
``unavailable(n, retry_after=k)`` (503, nothing made), ``lose_reply(n)`` (the job is made,
then 500: the reply is lost), ``drop_after_create(n)`` (the job is made, then the connection
is closed without a reply), ``refuse(n, status, body)`` (any refusal, nothing made); and
``throttle_reads(n, retry_after=k, status=429)`` for the next ``n`` GETs (polls, results,
listings).
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import socket
import sys
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import ROUND_CEILING, Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

MILLION = 1_000_000


@dataclass(frozen=True)
class Seen:
    """One request an origin received: method, path with its query, headers (names
    lower-cased) and the body as sent (bytes)."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes = b""

    @property
    def json(self) -> Any:
        try:
            return json.loads(self.body) if self.body else None
        except ValueError:
            return None


@dataclass
class Reply:
    """What a handler answers: a status, a body (``bytes`` as they are, anything else as
    JSON), extra headers; ``drop`` closes the connection without any reply."""

    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str | None = None
    drop: bool = False


class Clock:
    """The stand-in's own time: it starts at the wall clock and moves only when a test says
    so (``advance``), so a retention window passes without anyone sleeping."""

    def __init__(self) -> None:
        self._start = datetime.now(UTC)
        self._offset = timedelta()
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._start + self._offset

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._offset += timedelta(seconds=seconds)


def iso(moment: datetime | None) -> str | None:
    """RFC 3339 with microseconds and ``Z``, as both APIs write their timestamps."""
    if moment is None:
        return None
    return moment.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


@dataclass
class Fault:
    kind: str  # throttle, unavailable, lose_reply, drop_after_create, refuse
    left: int
    status: int = 0
    retry_after: str | None = None
    body: Any = None


class Faults:
    """Faults armed by a test for the next creates; the first armed is used first."""

    def __init__(self) -> None:
        self._armed: list[Fault] = []
        self._lock = threading.Lock()

    def arm(self, fault: Fault) -> None:
        with self._lock:
            self._armed.append(fault)

    def take(self) -> Fault | None:
        with self._lock:
            while self._armed and self._armed[0].left <= 0:
                self._armed.pop(0)
            if not self._armed:
                return None
            fault = self._armed[0]
            fault.left -= 1
            return fault

    def clear(self) -> None:
        with self._lock:
            self._armed.clear()


def second_loopback() -> str:
    """127.0.0.2 where it can be bound (Linux), else 127.0.0.1 (another port: another origin)."""
    try:
        with socket.socket() as probe:
            probe.bind(("127.0.0.2", 0))
        return "127.0.0.2"
    except OSError:
        return "127.0.0.1"


class _Quiet(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            return  # a client that gave up (a timeout under test) is expected here
        super().handle_error(request, client_address)


Handler = Callable[[Seen, str, dict[str, list[str]]], Reply]
"""(the request, its path without the query, its query) -> the reply."""


class Origin:
    """One HTTP origin on loopback, port 0, recording every request in ``requests``."""

    def __init__(self, host: str, handle: Handler) -> None:
        self.requests: list[Seen] = []
        self._handle = handle
        self._httpd = _Quiet((host, 0), _handler_class(self))
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True)

    @property
    def origin(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def _handler_class(origin: Origin) -> type[BaseHTTPRequestHandler]:
    class _Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            headers = {name.lower(): value for name, value in self.headers.items()}
            seen = Seen(self.command, self.path, headers, body)
            origin.requests.append(seen)
            url = urlparse(self.path)
            reply = origin._handle(seen, url.path, parse_qs(url.query))
            if reply.drop:
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            if isinstance(reply.body, bytes):
                data = reply.body
                kind = reply.content_type or media_type(data)
            elif reply.body is None and reply.status in (204, 304):
                data, kind = b"", ""
            else:
                data = json.dumps(reply.body).encode()
                kind = reply.content_type or "application/json"
            self.send_response(reply.status)
            if kind:
                self.send_header("Content-Type", kind)
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = _serve

    return _Handler


class StandIn:
    """Both origins, the clock, the faults and the provider-side counters (the API's own
    parts live in the subclasses). Usable as a context manager; ``base_url`` goes in a
    profile's ``base_url``."""

    def __init__(self, *, token: str) -> None:
        self.token = token
        self.clock = Clock()
        self.faults = Faults()
        self.read_faults = Faults()  # armed on the API's GETs (polls, results, listings)
        self.lock = threading.RLock()
        self.jobs_made: Counter[str] = Counter()  # per prompt (the input's ``prompt``)
        self.bills: dict[str, int] = {}  # job id -> micro-units billed for it
        self.cancels: Counter[str] = Counter()  # job id -> cancel calls
        self.create_calls = 0  # every create that reached the API, refused or not
        self.api = Origin("127.0.0.1", self._api)
        self.delivery = Origin(second_loopback(), self._delivery)

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> StandIn:
        self.api.start()
        self.delivery.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.api.stop()
        self.delivery.stop()

    # ------------------------------------------------------------------ what a test reads
    @property
    def requests(self) -> list[Seen]:
        """Every request the API origin received, in order."""
        return self.api.requests

    @property
    def downloads(self) -> list[Seen]:
        """Every request the delivery origin received, in order."""
        return self.delivery.requests

    @property
    def bill_micros(self) -> int:
        """What the provider has billed in all, in micro-units."""
        with self.lock:
            return sum(self.bills.values())

    @property
    def jobs_made_total(self) -> int:
        return sum(self.jobs_made.values())

    @property
    def credential_reached_delivery(self) -> bool:
        """Whether any request to the delivery origin carried a credential (an
        ``Authorization`` header, or the token anywhere in its headers or URL)."""
        for seen in self.delivery.requests:
            if "authorization" in seen.headers or self.token in seen.path:
                return True
            if any(self.token in value for value in seen.headers.values()):
                return True
        return False

    # ------------------------------------------------------------------ what a test does
    def advance(self, seconds: float) -> None:
        """Move the stand-in's clock (retention windows pass; nothing sleeps)."""
        self.clock.advance(seconds)

    def throttle(self, n: int = 1, *, retry_after: int | str | None = 1) -> None:
        """The next ``n`` creates answer 429 (``Retry-After`` when not None); nothing made."""
        self.faults.arm(Fault("throttle", n, 429, _header(retry_after)))

    def unavailable(self, n: int = 1, *, retry_after: int | str | None = 1) -> None:
        """The next ``n`` creates answer 503 (``Retry-After`` when not None); nothing made."""
        self.faults.arm(Fault("unavailable", n, 503, _header(retry_after)))

    def lose_reply(self, n: int = 1) -> None:
        """The next ``n`` creates make their job, then answer 500 (the reply is lost)."""
        self.faults.arm(Fault("lose_reply", n, 500))

    def drop_after_create(self, n: int = 1) -> None:
        """The next ``n`` creates make their job, then close the connection unanswered."""
        self.faults.arm(Fault("drop_after_create", n))

    def refuse(self, n: int, status: int, body: Any = None) -> None:
        """The next ``n`` creates answer ``status`` with ``body`` (None: the provider's
        documented body for that status); nothing made."""
        self.faults.arm(Fault("refuse", n, status, None, body))

    def throttle_reads(
        self, n: int = 1, *, retry_after: int | str | None = 1, status: int = 429
    ) -> None:
        """The next ``n`` GETs of the API (polls, results, listings) answer ``status`` (429
        or 503) with ``Retry-After`` when not None."""
        kind = "throttle" if status == 429 else "unavailable"
        self.read_faults.arm(Fault(kind, n, status, _header(retry_after)))

    # ------------------------------------------------------------------ for subclasses
    def bill(self, job_id: str, micros: int) -> None:
        """Record the provider's charge for a job, once."""
        with self.lock:
            if job_id not in self.bills and micros > 0:
                self.bills[job_id] = micros

    def _api(self, seen: Seen, path: str, query: dict[str, list[str]]) -> Reply:
        raise NotImplementedError

    def _delivery(self, seen: Seen, path: str, query: dict[str, list[str]]) -> Reply:
        raise NotImplementedError


def _header(value: int | str | None) -> str | None:
    return None if value is None else str(value)


def ceil_micros(value: Decimal) -> int:
    """A Decimal amount of micro-units, rounded up to a whole micro-unit (a provider never
    bills a fraction below its unit, and rounding up never under-counts it)."""
    return int(value.to_integral_value(rounding=ROUND_CEILING))


def seconds_decimal(seconds: float) -> Decimal:
    """A reported time in seconds, exactly as the reply writes it."""
    return Decimal(repr(seconds))


@functools.lru_cache(maxsize=64)
def render_picture(seed_text: str, width: int, height: int, kind: str = "png") -> bytes:
    """A deterministic ``width`` x ``height`` picture of ``seed_text`` (PNG, WEBP or JPEG)."""
    from PIL import Image

    digest = hashlib.sha256(seed_text.encode()).digest()
    tile = Image.frombytes("RGB", (8, 8), (digest * 6)[: 8 * 8 * 3])
    image = Image.new("RGB", (width, height), tuple(digest[:3]))
    image.paste(tile.resize((max(1, width // 2), max(1, height // 2))), (width // 4, height // 4))
    out = io.BytesIO()
    image.save(out, format={"jpg": "JPEG"}.get(kind, kind.upper()))
    return out.getvalue()


def media_type(data: bytes) -> str:
    if data.startswith(b"\x89PNG"):
        return "image/png"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    if data.startswith(b"\xff\xd8"):
        return "image/jpeg"
    return "application/octet-stream"


CONTENT_TYPES = {
    "png": "image/png",
    "webp": "image/webp",
    "jpeg": "image/jpeg",
    "jpg": "image/jpeg",
}
