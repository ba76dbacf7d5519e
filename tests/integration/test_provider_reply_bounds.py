"""`providers check` reads at most 5 MB of a reply (a schema), declared or streamed: a
larger one is "no answer" in one line, read no further."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from tests.http_server import _QuietServer
from tests.integration.test_provider_check import check, providers_file

__all__ = ["providers_file"]  # a fixture, re-used

_MB = 1024 * 1024


class _Huge(BaseHTTPRequestHandler):
    """The account answers; the model's reply is 8 MB of JSON whitespace, declared in
    Content-Length or (`chunked`) streamed without one."""

    protocol_version = "HTTP/1.1"
    chunked = False
    sent = 0

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        if self.path.startswith("/v1/account"):
            body = b'{"username": "ann"}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if not self.chunked:
            self.send_header("Content-Length", str(8 * _MB))
        else:
            self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        chunk = b" " * (64 * 1024)
        try:
            for _ in range(8 * _MB // len(chunk)):
                if self.chunked:
                    self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                else:
                    self.wfile.write(chunk)
                type(self).sent += len(chunk)
            if self.chunked:
                self.wfile.write(b"0\r\n\r\n")
        except ConnectionError:
            pass


@pytest.fixture(params=[False, True], ids=["declared", "chunked"])
def huge(request: pytest.FixtureRequest) -> Iterator[str]:
    handler = type("Handler", (_Huge,), {"chunked": request.param, "sent": 0})
    server = _QuietServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_replicate_a_reply_over_5_mb_is_refused_in_one_line(
    huge: str, providers_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    providers_file.write_text(
        "profiles:\n  p:\n    kind: replicate\n    model: black-forest-labs/flux-schnell\n"
        f"    base_url: {huge}\n    credential_env: REP_TOKEN\n"
        '    price: {per_image: "0.003"}\n    timeout_s: 30\n'
    )
    code, out, _ = check(capsys)
    last = out.splitlines()[-1]
    assert last.startswith("check: no answer: "), out
    assert f"larger than {5 * _MB} bytes refused" in last or (
        f"of {8 * _MB} bytes refused (limit {5 * _MB})" in last
    ), last
    assert code == 1
