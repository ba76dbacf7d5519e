"""A real local HTTP server speaking the predictions protocol, with fault injection.

Markers in the prompt choose a fault for the create call:
``[[HTTP_429:n]]`` / ``[[HTTP_500:n]]`` (the first n creates of that client reference are
refused), ``[[SLOW_MS:n]]`` (the reply comes after n ms), ``[[ACCEPT_DROP]]`` (the job is
accepted, then the connection is closed without a reply). The server honours
``Idempotency-Key`` and counts every create it accepts, per client reference.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from providers.fake import render_png

TOKEN = "test-token-not-a-secret"


class PredictionsServer:
    def __init__(self, *, processing_polls: int = 1) -> None:
        self.jobs: dict[str, dict[str, Any]] = {}
        self.by_key: dict[str, str] = {}
        self.accepted: Counter[str] = Counter()  # creates that made a job, per client reference
        self.create_calls: Counter[str] = Counter()  # every create call that arrived
        self.lock = threading.Lock()
        self.processing_polls = processing_polls
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def __enter__(self) -> PredictionsServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _marker(prompt: str, name: str) -> int | None:
    match = re.search(rf"\[\[{name}(?::([0-9]+))?\]\]", prompt)
    if match is None:
        return None
    return int(match[1]) if match[1] else 1


def _handler(server: PredictionsServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _send(self, code: int, body: Any, content_type: str = "application/json") -> None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self) -> bool:
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                self._send(401, {"detail": "unauthorized"})
                return False
            return True

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length) or b"{}")
            if not self._authorized() or urlparse(self.path).path != "/v1/predictions":
                return
            key = self.headers.get("Idempotency-Key", "")
            prompt = body["input"]["prompt"]
            with server.lock:
                server.create_calls[key] += 1
                calls = server.create_calls[key]
            for name, code in (("HTTP_429", 429), ("HTTP_500", 500)):
                limit = _marker(prompt, name)
                if limit is not None and calls <= limit:
                    self._send(code, {"detail": name})
                    return
            with server.lock:
                job_id = server.by_key.get(key)
                if job_id is None:
                    job_id = uuid.uuid4().hex
                    server.by_key[key] = job_id
                    server.jobs[job_id] = {
                        "id": job_id,
                        "polls": 0,
                        "prompt": prompt,
                        "seed": body["input"]["seed"],
                        "client_reference": body.get("client_reference"),
                    }
                    server.accepted[key] += 1
            slow = _marker(prompt, "SLOW_MS")
            if slow:
                time.sleep(slow / 1000)
            if _marker(prompt, "ACCEPT_DROP") is not None and calls == 1:
                self.close_connection = True
                self.connection.close()  # accepted, but the caller never hears it
                return
            self._send(201, {"id": job_id, "status": "starting"})

        def do_GET(self) -> None:
            if not self._authorized():
                return
            url = urlparse(self.path)
            if url.path == "/v1/predictions":
                ref = parse_qs(url.query).get("client_reference", [""])[0]
                with server.lock:
                    job_id = server.by_key.get(ref)
                self._send(200, {"results": [{"id": job_id}] if job_id else []})
                return
            if url.path.startswith("/v1/files/"):
                job = server.jobs.get(url.path.rsplit("/", 1)[-1].removesuffix(".png"))
                if job is None:
                    self._send(404, {"detail": "no such file"})
                    return
                self._send(200, render_png(job["prompt"], job["seed"]), "image/png")
                return
            job = server.jobs.get(url.path.rsplit("/", 1)[-1])
            if job is None:
                self._send(404, {"detail": "no such prediction"})
                return
            with server.lock:
                job["polls"] += 1
                done = job["polls"] > server.processing_polls
            reply: dict[str, Any] = {
                "id": job["id"],
                "status": "succeeded" if done else "processing",
            }
            if done:
                reply["output"] = [f"{server.base_url}/files/{job['id']}.png"]
            self._send(200, reply)

    return Handler
