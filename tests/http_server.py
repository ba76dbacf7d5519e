"""A real local HTTP server speaking the predictions protocol, with fault injection.

``PredictionsServer`` serves ``POST /v1/predictions``, ``GET /v1/predictions/{id}``,
``GET /v1/predictions?client_reference=...`` (bearer ``TOKEN`` required) and the outputs at
``GET /v1/files/{id}.png`` (no credential required). Markers in the prompt inject faults; ``:n``
applies one to the first n calls (default 1), counted per Idempotency-Key for creates and per
job for polls and downloads.

Create, refused and no job made: ``[[HTTP_429:n]]``, ``[[HTTP_500:n]]``, ``[[REFUSE_422:n]]``
(validation). Create, job made, then: ``[[CREATED_502:n]]``, ``[[CREATED_504:n]]``,
``[[CREATED_409:n]]``, ``[[CREATED_422_IDEMPOTENCY:n]]`` (an idempotency-key problem),
``[[CREATED_503:n]]`` (503 with ``Retry-After: retry_after``: a gateway that answers "come back
later" after the server made the job),
``[[MALFORMED_CREATE:n]]`` (201 with a body that is not JSON), ``[[ACCEPT_DROP:n]]`` (connection
closed without a reply), ``[[SLOW_MS:n]]`` (every reply after n ms).
Collect: ``[[POLL_QUEUED:n]]`` (status ``queued``), ``[[POLL_401:n]]``, ``[[POLL_500:n]]``,
``[[POLL_BADJSON:n]]``, ``[[DOWNLOAD_404:n]]``, ``[[REMOTE_FAIL]]`` (the job ends ``failed``).
Download, 200 with what is not the image: ``[[DOWNLOAD_HTML:n]]`` (an HTML error page),
``[[DOWNLOAD_TRUNCATED:n]]`` (the PNG cut in half), ``[[DOWNLOAD_GIF:n]]`` (another type),
``[[DOWNLOAD_EMPTY:n]]`` (no body at all).

Options: ``honour_idempotency`` (False: every create makes a new job), ``processing_polls``
(polls answered ``processing`` before the job succeeds), ``price_micros`` (billed per job made),
``expired`` (job ids whose output file answers 410 Gone: the output expired while the job
still polls succeeded), ``list_ignores_filter`` (the list returns every job, newest first),
``page_size`` (the list is paginated with relative ``next`` links), ``output_host`` (outputs
are served by a second ``FileServer`` on another origin), ``report_cost`` (a finished job's
reply carries its cost, ``cost_micros``: ``price_micros``), ``compute_s`` (a finished job's
reply carries ``metrics.predict_time``, seconds; the bill is then ``price_micros`` per second
of it, rounded up to a micro-unit, counted when the job finishes). Both servers record every request
in ``requests``.

Throttles: ``throttled_calls`` (create calls, numbered per Idempotency-Key from 1) are answered
``throttle_status`` (429 or 503) with ``Retry-After: retry_after`` before anything is made;
``create_log`` holds (``time.monotonic()``, status) of every create, in order.

``reply`` (for fuzzing): a callable ``(kind, path) -> (status, body) | None`` asked before each
answer (kind: ``create``, ``poll``, ``list`` or ``file``); a non-None answer is sent instead
(``bytes`` as they are, anything else as JSON). A create it answers still makes the job.
"""

from __future__ import annotations

import io
import json
import re
import socket
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlparse

from episodic.providers.fake import render_png

TOKEN = "test-token-not-a-secret"
IDEMPOTENCY_PROBLEM = {
    "type": "https://example.com/problems/idempotency-key-reuse",
    "title": "Idempotency-Key in use",
}
_CREATED_FAULTS = (
    ("CREATED_502", 502, {"detail": "bad gateway"}),
    ("CREATED_504", 504, {"detail": "gateway timeout"}),
    ("CREATED_409", 409, {"detail": "conflict"}),
    ("CREATED_422_IDEMPOTENCY", 422, IDEMPOTENCY_PROBLEM),
    ("CREATED_503", 503, {"detail": "service unavailable"}),
)


@dataclass(frozen=True)
class Seen:
    method: str
    path: str  # with the query string
    headers: dict[str, str]  # names lower-cased


def _marker(prompt: str, name: str) -> int | None:
    match = re.search(rf"\[\[{name}(?::([0-9]+))?\]\]", prompt)
    if match is None:
        return None
    return int(match[1]) if match[1] else 1


def _hits(prompt: str, name: str, count: int) -> bool:
    limit = _marker(prompt, name)
    return limit is not None and count <= limit


class _QuietServer(ThreadingHTTPServer):
    """A client that gave up on a slow reply (a timeout under test) is expected here: no
    traceback on the console for the write that found the connection closed."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class _Http:
    """One ThreadingHTTPServer on a loopback address, recording every request."""

    def __init__(self, owner: PredictionsServer, host: str, api: bool) -> None:
        self.requests: list[Seen] = []
        self.httpd = _QuietServer((host, 0), _handler(owner, self, api))
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)

    @property
    def origin(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class FileServer(_Http):
    """Serves outputs at ``/files/{id}.png`` from another origin (127.0.0.2 when bindable)."""

    def __init__(self, owner: PredictionsServer) -> None:
        super().__init__(owner, _second_loopback(), api=False)

    @property
    def base_url(self) -> str:
        return self.origin


class PredictionsServer(_Http):
    def __init__(
        self,
        *,
        processing_polls: int = 1,
        honour_idempotency: bool = True,
        price_micros: int = 50_000,  # 0.05: the tests' profiles say cost_per_image_minor: 5
        list_ignores_filter: bool = False,
        page_size: int | None = None,
        output_host: bool = False,
        on_create: Callable[[str, int], None] | None = None,
        report_cost: bool = False,
        compute_s: float | None = None,
    ) -> None:
        self.report_cost = report_cost
        self.compute_s = compute_s  # None: per job made; else per second of it, when done
        self.jobs: dict[str, dict[str, Any]] = {}  # insertion order: oldest first
        self.on_create = on_create  # called with (prompt, calls so far) as a create arrives
        self.by_key: dict[str, str] = {}  # Idempotency-Key -> job id, when honoured
        self.jobs_made: Counter[str] = Counter()  # jobs created, per Idempotency-Key
        self.create_calls: Counter[str] = Counter()  # every create call that arrived
        self.downloads: Counter[str] = Counter()  # per job id
        # job ids whose output expired: the job still polls succeeded, its file answers 410
        # (as a provider that keeps a prediction's record longer than its output)
        self.expired: set[str] = set()
        self.bill_micros = 0
        self.lock = threading.Lock()
        self.processing_polls = processing_polls
        self.honour_idempotency = honour_idempotency
        self.price_micros = price_micros
        self.list_ignores_filter = list_ignores_filter
        self.page_size = page_size
        self.files = FileServer(self) if output_host else None
        self.faults_off = False  # set True to end every collect fault (the CDN caught up)
        self.reply: Callable[[str, str], tuple[int, Any] | None] | None = None
        self.throttled_calls: set[int] = set()  # per key: answered 429/503, nothing made
        self.throttle_status = 429
        self.retry_after = "1"
        self.create_log: list[tuple[float, int]] = []  # (time.monotonic(), status)
        super().__init__(self, "127.0.0.1", api=True)

    @property
    def accepted(self) -> Counter[str]:
        """Jobs made per client reference (the older name of ``jobs_made``)."""
        return self.jobs_made

    @property
    def base_url(self) -> str:
        return f"{self.origin}/v1"

    def output_url(self, job_id: str) -> str:
        base = self.files.base_url if self.files else self.base_url
        return f"{base}/files/{job_id}.png"

    def __enter__(self) -> PredictionsServer:
        self.start()
        if self.files:
            self.files.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        if self.files:
            self.files.stop()

    def create(self, key: str, body: dict[str, Any]) -> str:
        """The job for this create: a new one, or the key's job when idempotency is honoured."""
        with self.lock:
            if self.honour_idempotency and key in self.by_key:
                return self.by_key[key]
            job_id = uuid.uuid4().hex
            self.by_key[key] = job_id
            self.jobs[job_id] = {
                "id": job_id,
                "polls": 0,
                "prompt": body["input"]["prompt"],
                "seed": body["input"]["seed"],
                "client_reference": body.get("client_reference"),
            }
            self.jobs_made[key] += 1
            if self.compute_s is None:
                self.bill_micros += self.price_micros
            return job_id

    def listing(self, ref: str, page: int) -> dict[str, Any]:
        with self.lock:
            jobs = list(reversed(self.jobs.values()))
        if not self.list_ignores_filter:
            jobs = [job for job in jobs if job["client_reference"] == ref]
        results = [{"id": job["id"], "client_reference": job["client_reference"]} for job in jobs]
        size = self.page_size or len(results) or 1
        reply: dict[str, Any] = {"results": results[(page - 1) * size : page * size]}
        if page * size < len(results):
            query = urlencode({"client_reference": ref, "page": page + 1})
            reply["next"] = f"/v1/predictions?{query}"
        return reply

    def forced(self, kind: str, path: str) -> tuple[int, Any] | None:
        return None if self.reply is None else self.reply(kind, path)

    def poll(self, job: dict[str, Any]) -> tuple[int, Any]:
        with self.lock:
            job["polls"] += 1
            polls = job["polls"]
        prompt = job["prompt"]
        if not self.faults_off and _hits(prompt, "POLL_401", polls):
            return 401, {"detail": "unauthorized"}
        if not self.faults_off and _hits(prompt, "POLL_500", polls):
            return 500, {"detail": "internal error"}
        if not self.faults_off and _hits(prompt, "POLL_BADJSON", polls):
            return 200, b'{"status": "succ'
        reply: dict[str, Any] = {"id": job["id"], "status": "processing"}
        if not self.faults_off and _hits(prompt, "POLL_QUEUED", polls):
            reply["status"] = "queued"
        elif polls > self.processing_polls and "[[REMOTE_FAIL]]" in prompt:
            reply.update(status="failed", error="the model crashed")
        elif polls > self.processing_polls:
            reply.update(status="succeeded", output=[self.output_url(job["id"])])
        if reply["status"] in ("failed", "succeeded"):
            self._measured(job, reply)
        return 200, reply

    def _measured(self, job: dict[str, Any], reply: dict[str, Any]) -> None:
        """A finished job's reply: its cost and compute time, as the options say; a
        per-second bill counts the job once, when it first finishes."""
        if self.report_cost:
            reply["cost_micros"] = self.price_micros
        if self.compute_s is not None:
            from decimal import ROUND_CEILING, Decimal

            reply["metrics"] = {"predict_time": self.compute_s}
            with self.lock:
                if not job.get("billed"):
                    job["billed"] = True
                    due = Decimal(self.price_micros) * Decimal(repr(self.compute_s))
                    self.bill_micros += int(due.to_integral_value(rounding=ROUND_CEILING))

    def file(self, job_id: str) -> tuple[int, Any]:
        job = self.jobs.get(job_id)
        if job is None:
            return 404, {"detail": "no such file"}
        with self.lock:
            self.downloads[job_id] += 1
            count = self.downloads[job_id]
        if job_id in self.expired:
            return 410, {"detail": "output expired"}
        if not self.faults_off and _hits(job["prompt"], "DOWNLOAD_404", count):
            return 404, {"detail": "not there yet"}
        png = render_png(job["prompt"], job["seed"])
        for name, wrong in _download_faults(png):
            if not self.faults_off and _hits(job["prompt"], name, count):
                return 200, wrong
        return 200, png


def _download_faults(png: bytes) -> list[tuple[str, bytes]]:
    """What a download answers 200 with instead of the image (`DOWNLOAD_HTML` and the rest)."""
    from PIL import Image

    gif = io.BytesIO()
    with Image.open(io.BytesIO(png)) as image:
        image.convert("RGB").save(gif, format="GIF")
    return [
        ("DOWNLOAD_HTML", b"<html><body>503 Service Unavailable</body></html>"),
        ("DOWNLOAD_TRUNCATED", png[: len(png) // 2]),
        ("DOWNLOAD_GIF", gif.getvalue()),
        ("DOWNLOAD_EMPTY", b""),
    ]


def _second_loopback() -> str:
    """127.0.0.2 where it can be bound (Linux), else 127.0.0.1 (another port: another origin)."""
    try:
        with socket.socket() as probe:
            probe.bind(("127.0.0.2", 0))
        return "127.0.0.2"
    except OSError:
        return "127.0.0.1"


def _handler(server: PredictionsServer, http: _Http, api: bool) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _record(self) -> None:
            headers = {name.lower(): value for name, value in self.headers.items()}
            http.requests.append(Seen(self.command, self.path, headers))

        def _send(self, code: int, body: Any, retry_after: str | None = None) -> None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            png = data.startswith(b"\x89PNG")
            if self.command == "POST":
                with server.lock:
                    server.create_log.append((time.monotonic(), code))
            self.send_response(code)
            if retry_after is not None:
                self.send_header("Retry-After", retry_after)
            self.send_header("Content-Type", "image/png" if png else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self) -> bool:
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                self._send(401, {"detail": "unauthorized"})
                return False
            return True

        def do_POST(self) -> None:
            self._record()
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length) or b"{}")
            if not api or urlparse(self.path).path != "/v1/predictions":
                self._send(404, {"detail": "not found"})
                return
            if not self._authorized():
                return
            key = self.headers.get("Idempotency-Key") or str(body.get("client_reference"))
            prompt = body["input"]["prompt"]
            with server.lock:
                server.create_calls[key] += 1
                calls = server.create_calls[key]
            if server.on_create is not None:
                server.on_create(prompt, calls)
            if calls in server.throttled_calls:
                code = server.throttle_status
                self._send(code, {"detail": "throttled"}, retry_after=server.retry_after)
                return
            for name, code in (("HTTP_429", 429), ("HTTP_500", 500), ("REFUSE_422", 422)):
                if _hits(prompt, name, calls):
                    self._send(code, {"detail": name.lower()})
                    return
            job_id = server.create(key, body)
            if (forced := server.forced("create", self.path)) is not None:
                self._send(*forced)
                return
            slow = _marker(prompt, "SLOW_MS")
            if slow:
                time.sleep(slow / 1000)
            if _hits(prompt, "ACCEPT_DROP", calls):
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)  # made, but the caller never hears
                return
            for name, code, problem in _CREATED_FAULTS:
                if _hits(prompt, name, calls):
                    wait = server.retry_after if code == 503 else None
                    self._send(code, problem, retry_after=wait)
                    return
            if _hits(prompt, "MALFORMED_CREATE", calls):
                self._send(201, b"<html>created</html>")
                return
            self._send(201, {"id": job_id, "status": "starting"})

        def do_GET(self) -> None:
            self._record()
            url = urlparse(self.path)
            files = "/v1/files/" if api else "/files/"
            kind = "file" if url.path.startswith(files) else None
            if kind is None and api and url.path == "/v1/predictions":
                kind = "list"
            elif kind is None and api:
                kind = "poll"
            if kind is not None and (forced := server.forced(kind, self.path)) is not None:
                self._send(*forced)
            elif url.path.startswith(files):  # outputs need no credential
                self._send(*server.file(url.path.rsplit("/", 1)[-1].removesuffix(".png")))
            elif not api:
                self._send(404, {"detail": "not found"})
            elif not self._authorized():
                return
            elif url.path == "/v1/predictions":
                query = parse_qs(url.query)
                ref = query.get("client_reference", [""])[0]
                self._send(200, server.listing(ref, int(query.get("page", ["1"])[0])))
            elif (job := server.jobs.get(url.path.removeprefix("/v1/predictions/"))) is not None:
                self._send(*server.poll(job))
            else:
                self._send(404, {"detail": "no such prediction"})

    return Handler
