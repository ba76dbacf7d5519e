"""`episodic prefect setup` as the README's production recipe runs it, on a real Prefect
server: the human output (as complete as `--json`) and the warning when two deployments
of the weekly flow schedule one pipeline, from the command and from the `prefect deploy`
build step, including the real `prefect deploy` that creates the second deployment (its
build step runs before Prefect registers the deployment, yet that deploy warns, not only a
later one)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.e2e.stack import PrefectServer, deploy_flow, run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PROJECT = Path(__file__).resolve().parents[2]
WEEKLY = "flows/weekly.py:weekly_episode"
WEEKLY_MODULE = "episodic.flows.weekly:weekly_episode"
BUILD_STEP = "from episodic.deployments.steps import setup; setup('weekly', 'episodic')"


def test_setup_prints_what_it_did_and_warns_of_a_second_weekly_deployment(
    tmp_path: Path,
) -> None:
    episodic = {
        "EPISODIC_DATABASE_URL": f"sqlite:///{tmp_path / 'episodic.db'}",
        "EPISODIC_HOME": str(tmp_path / "home"),
    }
    with PrefectServer(tmp_path / "stack", ui=False) as server:
        env = server.env(episodic)
        setup = run_cli(
            ["prefect", "setup", "--work-pool", "episodic"], env, PROJECT, program="episodic"
        )
        assert setup.returncode == 0, setup.stdout + setup.stderr
        lines = setup.stdout.splitlines()
        assert lines[0] == "pipeline weekly: timezone UTC"
        assert "provider fake: at most 8 jobs at once" in lines
        assert "work pool episodic: ready" in lines
        assert lines[-1].startswith("result storage: ")
        assert setup.stderr == ""

        warning = (
            "pipeline weekly is scheduled by 2 deployments of the weekly flow "
            "(weekly-episode/weekly, weekly-episode/weekly-copy)"
        )
        # `prefect deploy` of this project's weekly deployment (prefect.yaml, its build step):
        # the only deployment scheduling the pipeline, no warning
        deployed = run_cli(["deploy", "--name", "weekly"], env, PROJECT, timeout=300)
        assert deployed.returncode == 0, deployed.stdout[-3000:] + deployed.stderr[-3000:]
        assert "episodic: warning" not in deployed.stdout + deployed.stderr, deployed.stderr
        # the deploy that creates a copy with the same cron on the same pipeline warns itself
        copy = run_cli(
            [
                "deploy",
                WEEKLY_MODULE,
                "--name",
                "weekly-copy",
                "--cron",
                "0 9 * * 1",
                "--timezone",
                "UTC",
                "--pool",
                "episodic",
                "--param",
                "pipeline=weekly",
            ],
            env,
            PROJECT,
            timeout=300,
        )
        assert copy.returncode == 0, copy.stdout[-3000:] + copy.stderr[-3000:]
        adds = (
            "this deploy adds a second deployment scheduling pipeline weekly "
            f"(weekly-episode/weekly-copy): {warning}"
        )
        assert f"episodic: warning: {adds}" in copy.stderr, copy.stdout[-2000:] + copy.stderr
        assert copy.stderr.count("episodic: warning:") == 1, copy.stderr
        assert "Traceback" not in copy.stderr

        # a weekly deployment of another pipeline (Prefect's Python API) is not one of them
        deploy_flow(
            env,
            source=PROJECT,
            entrypoint=WEEKLY,
            name="other",
            work_pool_name="episodic",
            parameters={"pipeline": "other"},
            cron="0 9 * * 1",
            timezone="UTC",
        )
        again = run_cli(["prefect", "setup"], env, PROJECT, program="episodic")
        assert again.returncode == 0, again.stdout + again.stderr
        assert again.stderr.startswith(f"warning: {warning}"), again.stderr
        assert "Traceback" not in again.stderr
        as_json = run_cli(["prefect", "setup", "--json"], env, PROJECT, program="episodic")
        assert as_json.returncode == 0, as_json.stderr
        (listed,) = json.loads(as_json.stdout)["warnings"]
        assert listed.startswith(warning)
        other = run_cli(
            ["prefect", "setup", "--pipeline", "other"], env, PROJECT, program="episodic"
        )
        assert other.returncode == 0 and other.stderr == "", other.stderr

        # the step of a deploy that adds nothing (a redeploy) names both, once: its look at
        # exit finds no deployment added
        step = run_cli(["-c", BUILD_STEP], env, PROJECT, program=[sys.executable])
        assert step.returncode == 0, step.stderr
        assert f"episodic: warning: {warning}" in step.stderr
        assert step.stderr.count("episodic: warning:") == 1, step.stderr
