"""The e2e harness itself: a real server, a process pool, two workers, a trivial deployment."""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.stack import (
    STACK_TOKEN_VAR,
    PrefectServer,
    Worker,
    create_flow_run,
    create_process_pool,
    deploy_flow,
    flow_runs_of_deployment,
    pids_with_env,
    run_cli,
    wait_for_flow_runs,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SMOKE_FLOW = """
import os
import time

from prefect import flow


@flow(log_prints=True)
def hello(n: int = 0, pause: float = 2.0) -> int:
    time.sleep(pause)
    print(f"hello {n} from pid {os.getpid()} tz={os.environ.get('EPISODIC_TIMEZONE')}")
    return n * 2
"""


def test_server_pool_two_workers_run_a_deployment(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "smoke_flow.py").write_text(SMOKE_FLOW)

    with PrefectServer(tmp_path / "stack") as server:
        token = server.token
        assert server.proc is not None
        server_pid = server.proc.pid
        assert server.api_url.startswith("http://127.0.0.1:")
        assert server.api_url.endswith("/api")
        # The UI is served, and told where this server's API lives (not the default :4200).
        ui_settings = httpx.get(f"{server.ui_url}/ui-settings", timeout=10).json()
        assert ui_settings["api_url"] == server.api_url

        pool = create_process_pool(server, "smoke-pool")
        assert pool["type"] == "process"
        assert pool["base_job_template"], "process pool needs the default job template"
        assert create_process_pool(server, "smoke-pool")["id"] == pool["id"]  # idempotent

        deployment_id = deploy_flow(
            server,
            source=source,
            entrypoint="smoke_flow.py:hello",
            name="smoke",
            work_pool_name="smoke-pool",
        )

        extra = {"EPISODIC_TIMEZONE": "Europe/Berlin"}
        with (
            Worker(server, "smoke-pool", cwd=source, extra_env=extra, limit=1) as first,
            Worker(server, "smoke-pool", cwd=source, extra_env=extra, limit=1) as second,
        ):
            # One run through the CLI, the rest through REST.
            cli = run_cli(
                ["deployment", "run", "hello/smoke", "--param", "n=10"],
                server,
                tmp_path,
                check=True,
            )
            assert "hello/smoke" in cli.stdout, cli.stdout
            for n in range(3):
                create_flow_run(server, deployment_id, parameters={"n": n})

            runs = flow_runs_of_deployment(server, deployment_id)
            assert len(runs) == 4
            finished = wait_for_flow_runs(server, [r["id"] for r in runs], timeout=75)
            assert {r["state_type"] for r in finished} == {"COMPLETED"}
            assert sorted(r["parameters"]["n"] for r in finished) == [0, 1, 2, 10]

            assert first.alive() and second.alive()
            logs = first.log_text() + second.log_text()
            assert "tz=Europe/Berlin" in logs  # flow runs inherit the worker's extra env
            # Each worker runs one flow at a time (--limit 1), so both got work.
            ran = [re.findall(r"hello (\d+) from pid", w.log_text()) for w in (first, second)]
            assert all(ran), (first.log_tail(), second.log_tail())
            assert sorted(int(n) for n in ran[0] + ran[1]) == [0, 1, 2, 10]

            assert run_cli(["work-pool", "ls"], server, tmp_path).returncode == 0

        assert not first.alive() and not second.alive()
        assert server.alive()
        assert not [p for p in pids_with_env(STACK_TOKEN_VAR, token) if p != server_pid]

    assert not server.alive()
    time.sleep(0.2)
    assert pids_with_env(STACK_TOKEN_VAR, token) == []
    assert "prefect server start" in server.log_path.read_text()  # kept for post-mortems
