"""Four `episodic prefect setup --notify` started at once against a real `prefect server`:
(here: their automations step in 4 processes a Barrier releases together) briefly made
duplicate automations and one failed (`unexpected PrefectHTTPStatusError
404`, a duplicate another one had deleted). They converge: each exits 0, and one automation
of each name is left."""

from __future__ import annotations

import multiprocessing
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.stack import PrefectServer, api_request, run_cli
from tests.e2e.test_notifications import PROJECT
from tests.e2e.webhook import SAVE_BLOCK, hook

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RACERS = 4


def _setup_after(barrier: Any, env: dict[str, str], results: Any) -> None:
    """`prefect setup`'s automations step, in a process of its own, Prefect imported and its
    client warmed before the barrier: the racers' requests then interleave (whole
    `episodic` processes start too far apart to race)."""
    import os

    os.environ.clear()
    os.environ.update(env)
    from prefect.client.orchestration import get_client

    from episodic.deployments.notify import ensure_notifications

    with get_client(sync_client=True) as client:
        client.read_block_documents(limit=1)
    barrier.wait()
    try:
        done = ensure_notifications("weekly", "ops", 4 * 3600)
        results.put((0, repr(done)))
    except Exception as exc:
        results.put((1, f"{type(exc).__name__}: {exc}"))


def test_concurrent_setups_leave_one_automation_of_each_name(tmp_path: Path) -> None:
    episodic = {
        "EPISODIC_DATABASE_URL": f"sqlite:///{tmp_path / 'episodic.db'}",
        "EPISODIC_HOME": str(tmp_path / "home"),
    }
    with PrefectServer(tmp_path / "stack", ui=False) as server, hook() as (url, _):
        env = server.env(episodic)
        saved = run_cli([SAVE_BLOCK, url], env, PROJECT, program=[sys.executable, "-c"])
        assert saved.returncode == 0, saved.stderr[-3000:]
        # the pipeline's timezone recorded once: the race is the automations'
        first = run_cli(["prefect", "setup"], env, PROJECT, program="episodic")
        assert first.returncode == 0, first.stdout + first.stderr
        spawn = multiprocessing.get_context("spawn")
        barrier, results = spawn.Barrier(RACERS), spawn.Queue()
        racers = [
            spawn.Process(target=_setup_after, args=(barrier, dict(env), results))
            for _ in range(RACERS)
        ]
        for racer in racers:
            racer.start()
        outcomes = [results.get(timeout=300) for _ in racers]
        for racer in racers:
            racer.join(timeout=60)
        for code, output in outcomes:
            assert code == 0, output
        found = api_request(server, "POST", "/automations/filter", json={})
        names = sorted(a["name"] for a in found if a["name"].startswith("episodic weekly:"))
        assert names == ["episodic weekly: approval waits", "episodic weekly: flow run failed"]
        again = run_cli(["prefect", "setup", "--notify", "ops"], env, PROJECT, program="episodic")
        assert again.returncode == 0, again.stdout + again.stderr
        assert again.stdout.count(": updated") == 2, again.stdout
