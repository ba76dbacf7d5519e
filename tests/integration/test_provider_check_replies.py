"""`episodic providers check` against replies a real API, a proxy or a hostile schema may
give."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from tests.http_server import _QuietServer
from tests.integration.test_provider_check import check, providers_file, replicate, write
from tests.jobs_servers import REPLICATE_INPUTS, TOKEN, ReplicateServer

__all__ = ["providers_file", "replicate"]  # fixtures, re-used


def test_replicate_a_close_match_from_the_schema_is_shown_printable_on_one_line(
    replicate: ReplicateServer, providers_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The schema's input names come from the provider (or whatever `base_url` answers): the
    `it takes:` list and the `did you mean` hint both show them printable, so no newline or
    ANSI escape sequence reaches the terminal and the message stays one line."""
    hostile = "aspect_ratio\n\x1b[31mINJECTED"
    replicate.models = {
        "black-forest-labs/flux-schnell": {**REPLICATE_INPUTS, hostile: {}},
    }
    write(
        providers_file,
        "replicate",
        replicate,
        "model: black-forest-labs/flux-schnell",
        'inputs: {aspect_ration: "1:1"}',
    )
    code, out, _ = check(capsys)
    assert code == 2
    line = out.splitlines()[-1]
    assert line.startswith("check: profile 'p': input 'aspect_ration'"), out
    assert "\x1b" not in out


class _Drip(BaseHTTPRequestHandler):
    """Answers every GET with a valid Replicate reply, one byte at a time, a pause between
    bytes shorter than the profile's timeout_s but, in all, far longer."""

    pause = 0.4

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        if self.path.startswith("/v1/account"):
            body = json.dumps({"username": "ann"}).encode()
        else:
            body = json.dumps(
                {
                    "latest_version": {
                        "openapi_schema": {
                            "components": {"schemas": {"Input": {"properties": REPLICATE_INPUTS}}}
                        }
                    }
                }
            ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            for byte in body[:40]:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(self.pause)
            self.wfile.write(body[40:])
        except ConnectionError:
            pass


@pytest.fixture
def drip() -> Iterator[str]:
    server = _QuietServer(("127.0.0.1", 0), _Drip)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_replicate_a_reply_trickling_past_timeout_s_is_no_answer(
    drip: str, providers_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`timeout_s: 1`, and each reply takes ~16 s, a byte every 0.4 s: httpx's read timeout
    restarts at every byte, so only a deadline on the whole reply stops a server (or a
    proxy) that drips forever from keeping `providers check` waiting forever: "no answer",
    exit 1."""
    providers_file.write_text(
        "profiles:\n  p:\n    kind: replicate\n    model: black-forest-labs/flux-schnell\n"
        f"    base_url: {drip}\n    credential_env: REP_TOKEN\n"
        '    price: {per_image: "0.003"}\n    timeout_s: 1\n'
    )
    assert TOKEN
    code, out, _ = check(capsys)
    assert out.splitlines()[-1].startswith("check: no answer: "), out
    assert code == 1
