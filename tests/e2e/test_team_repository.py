"""episodic in a team's own Prefect project, as a team adopts it: the wheel built from this
checkout and installed into a fresh virtualenv; a team repository with its own `flows` and
`tasks` packages; `episodic init` there (playlist, providers file, `prefect.yaml`); a real
`prefect server`; the commands the written `prefect.yaml` opens with, `episodic prefect setup
--work-pool episodic` and `prefect deploy --all`, from the repository with the virtualenv's
Prefect; a process worker running on the virtualenv's Python with nothing of this checkout in its
environment. The repository's providers file points its Replicate profile at the Replicate
stand-in (tests/standins/replicate.py, written from Replicate's public API pages), whose own
record of predictions is the bill.

One weekly slot, created by the server's scheduler from the deployed schedule, runs on the
worker to its approval form: the relative playlist is the repository's (the pull step moves
the run there); an answer at the form resumes it and the worker assembles the episode;
`episodic check --all` is clean; the provider made one prediction per item. A worker started
without EPISODIC_PROJECT_DIR fails its run saying so, before any episode is allocated.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.stack import (
    PrefectServer,
    Worker,
    api_request,
    create_flow_run,
    flow_runs_of_deployment,
    read_deployment,
    read_flow_run,
    trigger_scheduler,
    wait_for_flow_run,
)
from tests.installed import build_wheel, clean_env, install_wheel, run, team_repository
from tests.standins.replicate import OFFICIAL_MODEL, TOKEN, ReplicateStandIn

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

STARTER_ITEMS = 3  # the playlist `episodic init` writes: v01, and v02 in two parts


def _run(
    program: Path, args: list[str], cwd: Path, env: dict[str, str], timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return run([str(program), *args], cwd, env, timeout)


def _last_monday_0900_utc() -> dt.datetime:
    """The latest Monday 09:00 UTC slot at or before now (the weekly schedule's cron)."""
    now = dt.datetime.now(dt.UTC)
    monday = (now - dt.timedelta(days=now.weekday())).replace(
        hour=9, minute=0, second=0, microsecond=0
    )
    return monday if monday <= now else monday - dt.timedelta(days=7)


def _point_at(providers: Path, base_url: str) -> None:
    """The team's Replicate profile, as `episodic init` wrote it, sent to the stand-in."""
    text = providers.read_text()
    model_line = f"    model: {OFFICIAL_MODEL}\n"
    assert model_line in text, text[:400]
    providers.write_text(text.replace(model_line, f"{model_line}    base_url: {base_url}\n", 1))


def test_a_team_repository_deploys_and_runs_the_weekly_slot_from_the_installed_wheel(
    tmp_path: Path,
) -> None:
    venv = install_wheel(build_wheel(tmp_path / "dist"), tmp_path / "install")
    episodic, prefect, python = (venv / "bin" / n for n in ("episodic", "prefect", "python"))
    team = team_repository(tmp_path)
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"  # one project database for everyone
    providers = team / "providers.yaml"
    initialized = _run(
        episodic,
        ["init"],
        team,
        clean_env(EPISODIC_PROVIDERS_FILE=str(providers), XDG_DATA_HOME=str(tmp_path / "xdg")),
    )
    assert initialized.returncode == 0, initialized.stderr
    assert {"playlist.yaml", "providers.yaml", "prefect.yaml"} <= {p.name for p in team.iterdir()}

    with (
        ReplicateStandIn() as replicate,
        PrefectServer(tmp_path / "stack", ui=False, late_runs=False) as server,
    ):
        _point_at(providers, replicate.base_url)
        common = {
            **server.client_vars(),
            "EPISODIC_DATABASE_URL": ledger,
            "EPISODIC_PROVIDERS_FILE": str(providers),
            "EPISODIC_PENDING_TTL_S": str(30 * 24 * 3600),  # the slot may be days "late"
        }
        # The deploying machine: no project folder of its own (a wheel install), its state
        # in the user's data folder; the pipeline's timezone recorded by the build step.
        deployer = clean_env(**common, XDG_DATA_HOME=str(tmp_path / "xdg"), EPISODIC_TIMEZONE="UTC")
        upgraded = _run(episodic, ["db", "upgrade"], team, deployer)
        assert upgraded.returncode == 0, upgraded.stderr
        setup = _run(episodic, ["prefect", "setup", "--work-pool", "episodic"], team, deployer)
        assert setup.returncode == 0, setup.stdout[-3000:] + setup.stderr[-3000:]
        deployed = _run(prefect, ["deploy", "--all"], team, deployer)
        assert deployed.returncode == 0, deployed.stdout[-3000:] + deployed.stderr[-3000:]
        weekly = read_deployment(server, "weekly-episode", "weekly")
        assert weekly["entrypoint"] == "episodic.flows.weekly:weekly_episode"
        assert weekly["parameters"] == {"pipeline": "weekly", "playlist": "playlist.yaml"}
        assert weekly["pull_steps"] == [{"episodic.deployments.steps.project_directory": {}}]
        assert str(team) not in json.dumps(weekly)  # nothing of the deploying machine

        # A worker that forgot EPISODIC_PROJECT_DIR: the run fails saying so, at once.
        (tmp_path / "worker").mkdir()
        worker_env = clean_env(**common, HOME=str(tmp_path / "worker-home"))
        with Worker(worker_env, "episodic", cwd=tmp_path / "worker", python=python, inherit=False):
            stray = create_flow_run(server, weekly["id"], parameters={"generate": False})
            failed = wait_for_flow_run(server, stray["id"], ("FAILED", "CRASHED"), timeout=180)
        message = (failed.get("state") or {}).get("message") or ""
        assert "EPISODIC_PROJECT_DIR is unset" in message, message
        assert _episodes(episodic, team, {**worker_env, "EPISODIC_PROJECT_DIR": str(team)}) == []

        # The worker as docs/production.md sets it up: the repository is its project folder.
        worker_env["EPISODIC_PROJECT_DIR"] = str(team)
        worker_env["REPLICATE_API_TOKEN"] = TOKEN
        slot = _last_monday_0900_utc()
        runs = trigger_scheduler(
            server,
            weekly["id"],
            start_time=slot - dt.timedelta(seconds=1),
            end_time=slot + dt.timedelta(minutes=1),
        )
        (scheduled,) = [
            r for r in runs if dt.datetime.fromisoformat(r["expected_start_time"]) == slot
        ]
        with Worker(
            worker_env, "episodic", cwd=tmp_path / "worker", python=python, inherit=False
        ) as worker:
            waiting = wait_for_flow_run(server, scheduled["id"], ("PAUSED",), timeout=300)
            (episode,) = _episodes(episodic, team, worker_env)
            assert episode["episode_id"].startswith(slot.strftime("%G-W%V-")), episode
            assert episode["state"] == "generated", episode
            assert episode["episode_id"] in read_flow_run(server, waiting["id"])["name"]
            answer = {"decision": "approve", "reviewer": "ann"}
            resumed = api_request(
                server, "POST", f"/flow_runs/{scheduled['id']}/resume", json={"run_input": answer}
            )
            assert resumed["status"] == "ACCEPT", resumed
            done = wait_for_flow_run(server, scheduled["id"], ("COMPLETED",), timeout=300)
            log = worker.log_text()
        assert done["state_name"] == "Completed", done
        assert "Traceback" not in log, log[-3000:]

        (episode,) = _episodes(episodic, team, worker_env)
        assert episode["state"] == "assembled", episode
        checked = _run(episodic, ["check", "--all", "--json"], tmp_path, worker_env)
        assert checked.returncode == 0, checked.stdout[-3000:] + checked.stderr[-3000:]
        # The provider's own record: one prediction per item, each billed once.
        prompts = [p.sent_input.get("prompt") for p in replicate.predictions.values()]
        assert len(prompts) == STARTER_ITEMS and len(set(prompts)) == STARTER_ITEMS, prompts
        assert replicate.bill_micros == STARTER_ITEMS * 3_000
        # Its state is the repository's: the paid images are in the team's state folder.
        assert (team / ".episodic").is_dir()
        assert not (tmp_path / "worker-home" / ".local" / "share" / "episodic").exists()
        unfinished = flow_runs_of_deployment(
            server, weekly["id"], state_types=["PENDING", "RUNNING", "PAUSED"]
        )
        assert unfinished == []


def _episodes(episodic: Path, cwd: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    listed = _run(episodic, ["episodes", "list", "--json"], cwd, env)
    assert listed.returncode == 0, listed.stderr
    found = json.loads(listed.stdout)
    episodes = found["episodes"] if isinstance(found, dict) else found
    assert isinstance(episodes, list), found
    return [dict(e) for e in episodes]
