"""A fault-injecting HTTP reverse proxy on loopback, for a store (or any HTTP server) that
answers errors or answers slowly: stdlib `http.server` in front, `http.client` behind.

``FaultProxy(target)`` forwards every request to `target` (``http://127.0.0.1:PORT``) and
passes the answer back, except that, per request and at random (its own `random.Random`):

- with probability `error_share` it answers `error_status` (500 or 503, chosen per request
  from `error_statuses`) with an S3-style XML error body, without asking the target;
- with probability `delay_share` it waits `delay_s` before forwarding.

`failing = True` answers every request with an error (a store that is down until set back).
Every fault is counted in `counts` (``forwarded``, ``500``, ``503``, ``delayed``), so a test
reports faults from the store's side. Nothing leaves the machine.
"""

from __future__ import annotations

import http.client
import random
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlparse

_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "expect",
}
_ERROR_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
    b"<Message>injected by the fault proxy</Message></Error>"
)
_CODES = {500: b"InternalError", 503: b"SlowDown"}


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that gave up on a delayed reply is expected here


class FaultProxy:
    def __init__(
        self,
        target: str,
        *,
        error_share: float = 0.0,
        error_statuses: tuple[int, ...] = (500, 503),
        delay_share: float = 0.0,
        delay_s: float = 0.0,
        seed: int = 0,
    ) -> None:
        parsed = urlparse(target)
        self.target_host = parsed.hostname or "127.0.0.1"
        self.target_port = parsed.port or 80
        self.error_share = error_share
        self.error_statuses = error_statuses
        self.delay_share = delay_share
        self.delay_s = delay_s
        self.failing = False
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.rng = random.Random(seed)
        self.httpd = _Server(("127.0.0.1", 0), _handler(self))
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> FaultProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def decide(self) -> tuple[int | None, float]:
        """(status to answer instead of forwarding, or None; seconds to wait first)."""
        with self.lock:
            if self.failing or self.rng.random() < self.error_share:
                status = self.rng.choice(self.error_statuses)
                self.counts[str(status)] += 1
                return status, 0.0
            if self.rng.random() < self.delay_share:
                self.counts["delayed"] += 1
                return None, self.delay_s
            self.counts["forwarded"] += 1
            return None, 0.0


def _read_body(handler: BaseHTTPRequestHandler) -> bytes:
    if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
        parts = []
        while True:
            size = int(handler.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while handler.rfile.readline().strip():  # trailers, then the blank line
                    pass
                return b"".join(parts)
            parts.append(handler.rfile.read(size))
            handler.rfile.readline()
    length = int(handler.headers.get("Content-Length") or 0)
    return handler.rfile.read(length) if length else b""


def _handler(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _answer(self) -> None:
            status, wait = proxy.decide()
            body = _read_body(self)
            if status is not None:
                data = _ERROR_BODY.replace(b"{code}", _CODES.get(status, b"InternalError"))
                self.send_response(status)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            if wait:
                time.sleep(wait)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
            if body or self.command in ("PUT", "POST"):
                headers["Content-Length"] = str(len(body))
            conn = http.client.HTTPConnection(proxy.target_host, proxy.target_port, timeout=60)
            try:
                conn.request(self.command, self.path, body=body or None, headers=headers)
                reply = conn.getresponse()
                data = reply.read()
                self.send_response(reply.status)
                head = self.command == "HEAD"  # its Content-Length is the object's
                for name, value in reply.getheaders():
                    if name.lower() not in _HOP and (head or name.lower() != "content-length"):
                        self.send_header(name, value)
                if not head:
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if not head:
                    self.wfile.write(data)
            finally:
                conn.close()

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _answer

    return Handler
