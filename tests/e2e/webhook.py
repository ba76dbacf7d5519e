"""A notification block that posts to a local HTTP server, and that server: it records the
JSON bodies it receives, so a test counts the notifications Prefect's automations sent."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

WAIT_S = 120.0  # at most, for a notification to arrive (polled, not a timing assertion)

SAVE_BLOCK = """
import sys
from prefect.blocks.notifications import CustomWebhookNotificationBlock
CustomWebhookNotificationBlock(
    name="ops", url=sys.argv[1], allow_private_urls=True,
    json_data={"subject": "{{subject}}", "body": "{{body}}"},
).save("ops", overwrite=True)
"""


@contextmanager
def hook() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A local HTTP server recording the JSON bodies POSTed to it: (url, received)."""
    received: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            received.append(json.loads(body or b"{}"))
            self.send_response(200)
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook", received
    finally:
        server.shutdown()
        server.server_close()


def wait_for(received: list[dict[str, Any]], word: str, count: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        found = [r for r in received if word in str(r.get("subject"))]
        if len(found) >= count:
            return found
        time.sleep(1)
    return [r for r in received if word in str(r.get("subject"))]
