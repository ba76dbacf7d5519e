"""`episodic prefect setup --notify BLOCK --approval-wait D` on a real `prefect server` (its
triggers and actions services run the automations): a custom-webhook notification block
points at a local HTTP server that counts what it receives. A failing flow run of ours is
notified once; a flow run suspended at an approval form longer than the wait is notified
once. Re-running the setup updates the two automations instead of adding duplicates."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.stack import PrefectServer, api_request, run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PROJECT = Path(__file__).resolve().parents[2]
WAIT_S = 120.0  # at most, for a notification to arrive (polled, not a timing assertion)

SAVE_BLOCK = """
import sys
from prefect.blocks.notifications import CustomWebhookNotificationBlock
CustomWebhookNotificationBlock(
    name="ops", url=sys.argv[1], allow_private_urls=True,
    json_data={"subject": "{{subject}}", "body": "{{body}}"},
).save("ops", overwrite=True)
"""

SUSPEND_A_RUN = """
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.states import Running, Suspended

@flow(name="weekly-episode")
def weekly_episode() -> None: ...

with get_client(sync_client=True) as client:
    run = client.create_flow_run(
        weekly_episode, name="weekly 2026-W32-0",
        tags=["episodic-approval:weekly/2026-W32-0/0123456789ab"],
    )
    client.set_flow_run_state(run.id, Running(), force=True)
    client.set_flow_run_state(run.id, Suspended(timeout_seconds=3600, pause_key="k"), force=True)
print(run.id)
"""

FAIL_A_RUN = "from flows.review import approve_episode; approve_episode(episode_id='nope')"


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


def _wait_for(received: list[dict[str, Any]], word: str, count: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        found = [r for r in received if word in str(r.get("subject"))]
        if len(found) >= count:
            return found
        time.sleep(1)
    return [r for r in received if word in str(r.get("subject"))]


def _automations(server: PrefectServer) -> list[str]:
    found = api_request(server, "POST", "/automations/filter", json={})
    return sorted(a["name"] for a in found if a["name"].startswith("episodic weekly:"))


def test_setup_notifies_a_failed_run_and_an_approval_that_waited(tmp_path: Path) -> None:
    episodic = {
        "EPISODIC_DATABASE_URL": f"sqlite:///{tmp_path / 'episodic.db'}",
        "EPISODIC_HOME": str(tmp_path / "home"),
    }
    with PrefectServer(tmp_path / "stack", ui=False) as server, hook() as (url, received):
        env = server.env(episodic)
        python = [sys.executable, "-c"]
        saved = run_cli([SAVE_BLOCK, url], env, PROJECT, program=python)
        assert saved.returncode == 0, saved.stderr[-3000:]
        setup = ["prefect", "setup", "--notify", "ops", "--approval-wait", "10s"]
        first = run_cli(setup, env, PROJECT, program="episodic")
        assert first.returncode == 0, first.stdout + first.stderr
        assert "automation 'episodic weekly: approval waits': created" in first.stdout
        again = run_cli(setup, env, PROJECT, program="episodic")
        assert again.returncode == 0, again.stdout + again.stderr
        assert "automation 'episodic weekly: flow run failed': updated" in again.stdout
        assert _automations(server) == [
            "episodic weekly: approval waits",
            "episodic weekly: flow run failed",
        ]

        failed = run_cli([FAIL_A_RUN], env, PROJECT, program=python)
        assert failed.returncode != 0
        suspended = run_cli([SUSPEND_A_RUN], env, PROJECT, program=python)
        assert suspended.returncode == 0, suspended.stderr[-3000:]

        failures = _wait_for(received, "flow run", 1)
        waits = _wait_for(received, "an approval waits", 1)
        time.sleep(15)  # longer than the wait again: a second notification would be here
        failures = [r for r in received if "flow run" in str(r.get("subject"))]
        waits = [r for r in received if "an approval waits" in str(r.get("subject"))]
        assert len(failures) == 1, received
        assert "Failed" in failures[0]["subject"], failures
        assert len(waits) == 1, received
        assert "weekly 2026-W32-0" in waits[0]["subject"], waits
        assert "episodic approve" in waits[0]["body"], waits


def test_setup_refuses_a_bad_wait_and_an_unknown_block(tmp_path: Path) -> None:
    episodic = {
        "EPISODIC_DATABASE_URL": f"sqlite:///{tmp_path / 'episodic.db'}",
        "EPISODIC_HOME": str(tmp_path / "home"),
    }
    with PrefectServer(tmp_path / "stack", ui=False) as server:
        env = server.env(episodic)
        bad = run_cli(["prefect", "setup", "--notify", "ops", "--approval-wait", "4 hours"],
                      env, PROJECT, program="episodic")  # fmt: skip
        assert bad.returncode == 2 and "--approval-wait" in bad.stderr, bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr
        unknown = run_cli(["prefect", "setup", "--notify", "nosuch"], env, PROJECT,
                          program="episodic")  # fmt: skip
        assert unknown.returncode == 2, unknown.stdout + unknown.stderr
        assert "no notification block" in unknown.stderr, unknown.stderr
