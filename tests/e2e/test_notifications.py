"""`episodic prefect setup --notify BLOCK --approval-wait D` on a real `prefect server` (its
triggers and actions services run the automations): a custom-webhook notification block
points at a local HTTP server that counts what it receives. A failing flow run of ours is
notified once; a flow run suspended at an approval form longer than the wait is notified
once. Re-running the setup updates the two automations instead of adding duplicates."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from tests.e2e.stack import PrefectServer, api_request, run_cli
from tests.e2e.webhook import SAVE_BLOCK, hook, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PROJECT = Path(__file__).resolve().parents[2]
SUSPEND_A_RUN = """
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.states import Running, Suspended

@flow(name="weekly-episode")
def weekly_episode() -> None: ...

# tagged as the product tags its runs: the deployment's tags at creation, the approval tag
# just before it suspends (`flows.approval.wait.claim_approval_wait`), after the run's first
# state events made the server cache its tags
# (two runs, as the two slots of a week wait at once, each its own notification)
with get_client(sync_client=True) as client:
    for episode in ("2026-W32-0", "2026-W32-1"):
        run = client.create_flow_run(
            weekly_episode, name=f"weekly {episode}", tags=["episodic", "pipeline:weekly"]
        )
        client.set_flow_run_state(run.id, Running(), force=True)
        approval = f"episodic-approval:weekly/{episode}/0123456789ab"
        client.update_flow_run(run.id, tags=["episodic", "pipeline:weekly", approval])
        suspended = Suspended(timeout_seconds=3600, pause_key="k")
        client.set_flow_run_state(run.id, suspended, force=True)
"""

FAIL_A_RUN = "from episodic.flows.review import approve_episode; approve_episode(episode_id='nope')"


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

        failures = wait_for(received, "flow run", 1)
        waits = wait_for(received, "an approval waits", 2)
        time.sleep(15)  # longer than the wait again: a second notification would be here
        failures = [r for r in received if "flow run" in str(r.get("subject"))]
        waits = [r for r in received if "an approval waits" in str(r.get("subject"))]
        assert len(failures) == 1, received
        assert "Failed" in failures[0]["subject"], failures
        assert len(waits) == 2, received  # one per waiting run
        subjects = sorted(str(w["subject"]) for w in waits)
        assert "weekly 2026-W32-0" in subjects[0] and "weekly 2026-W32-1" in subjects[1], waits
        assert all("episodic approve" in w["body"] for w in waits), waits


def test_setup_refuses_a_bad_wait_and_an_unknown_block(tmp_path: Path) -> None:
    episodic = {
        "EPISODIC_DATABASE_URL": f"sqlite:///{tmp_path / 'episodic.db'}",
        "EPISODIC_HOME": str(tmp_path / "home"),
    }
    with PrefectServer(tmp_path / "stack", ui=False) as server:
        env = server.env(episodic)
        bad = run_cli(
            ["prefect", "setup", "--notify", "ops", "--approval-wait", "4 hours"],
            env,
            PROJECT,
            program="episodic",
        )
        assert bad.returncode == 2 and "--approval-wait" in bad.stderr, bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr
        unknown = run_cli(
            ["prefect", "setup", "--notify", "nosuch"], env, PROJECT, program="episodic"
        )
        assert unknown.returncode == 2, unknown.stdout + unknown.stderr
        assert "no notification block" in unknown.stderr, unknown.stderr
        saved = run_cli(
            [
                "-c",
                "from prefect.blocks.webhook import Webhook; "
                "Webhook(url='http://127.0.0.1:9/hook').save('hook')",
            ],
            env,
            PROJECT,
            program=sys.executable,
        )
        assert saved.returncode == 0, saved.stderr[-2000:]
        plain = run_cli(["prefect", "setup", "--notify", "hook"], env, PROJECT, program="episodic")
        assert plain.returncode == 2, plain.stdout + plain.stderr
        assert len(plain.stderr.strip().splitlines()) == 1, plain.stderr
        assert "webhook/hook cannot send notifications" in plain.stderr, plain.stderr
        assert "Custom Webhook (custom-webhook)" in plain.stderr, plain.stderr
