"""A Prefect cancel settles money, and a killed flow run leaves no Running ghosts, on a
real `prefect server` with a process worker.

The fake provider's jobs are slow (90 s each), so a cancel lands while the provider holds
accepted jobs. The bill is read at the provider's side: the jobs it made (its job files)
and the jobs it cancelled (its ``.canceled`` markers), never from our tables.

- cancelling the weekly run (Cancelling through the API, as the UI's Cancel does) cancels
  the generate subflow's accepted jobs at the provider, from the flow's own SIGTERM path and
  the worker's `on_cancellation` hook; the run's log says what was cancelled, what still
  bills and the command that settles it, without a traceback; the episode's `-cost`
  artifact counts the bought jobs and says none is still running;
- the same for a generate deployment run cancelled on its own;
- after `kill -9` of a flow-run process, the sweep (the `sweep` flow, as scheduled)
  finalizes the generate subflow and its item task runs left Running, as Crashed, with a
  message naming the jobs left at the provider and the command that finishes the run.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy

from tests.databases import PostgresDatabases, require_postgres
from tests.e2e.stack import (
    WORKER_TOKEN_VAR,
    PrefectServer,
    Worker,
    api_request,
    create_flow_run,
    create_process_pool,
    deploy_flows,
    pids_with_env,
    read_flow_run,
    run_cli,
    wait_for_flow_run,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.postgres]

PROJECT = Path(__file__).resolve().parents[2]
PLAYLIST = PROJECT / "examples" / "playlist.yaml"
POOL = "episodic"
CONCURRENCY = 4  # the generate flow's default: four jobs in flight at once


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One server, the weekly, generate and sweep deployments, one process worker."""
    require_postgres()
    root = tmp_path_factory.mktemp("cancel")
    databases = PostgresDatabases()
    name = databases.fresh()
    episodic = {
        "EPISODIC_DATABASE_URL": databases.url(name),
        "EPISODIC_HOME": str(root / "home"),
        "EPISODIC_TIMEZONE": "UTC",
        "EPISODIC_FAKE_DELAY_MS": "90000",  # longer than the worker's 30 s kill grace
        "EPISODIC_LEASE_S": "6",
    }
    try:
        with PrefectServer(root / "stack") as server:
            create_process_pool(server, POOL)
            flows = [
                ("weekly", "flows/weekly.py:weekly_episode"),
                ("generate", "flows/generate.py:generate_episode"),
                ("sweep", "flows/maintenance.py:cancel_stale"),
            ]
            ids = deploy_flows(  # one process: Prefect and the project imported once
                server.env(episodic),
                [
                    {
                        "source": PROJECT,
                        "entrypoint": entrypoint,
                        "name": flow,
                        "work_pool_name": POOL,
                    }
                    for flow, entrypoint in flows
                ],
                cwd=PROJECT,
            )
            deployments = {flow: id_ for (flow, _), id_ in zip(flows, ids, strict=True)}
            _bill_the_price_once(server, episodic)
            with Worker(server, POOL, cwd=root, extra_env=episodic) as worker:
                yield {
                    "server": server,
                    "worker": worker,
                    "env": episodic,
                    "deployments": deployments,
                    "home": root / "home",
                }
    finally:
        databases.drop(name)
        databases.close()


def _bill_the_price_once(server: PrefectServer, episodic: dict[str, str]) -> None:
    """One fast paid call of the fake's price, in an earlier week, before the tests: the
    first call of a price never billed goes alone under a money limit and is collected before
    the next (`episodic.storage.budgets`), so a cancel would find that one job already done. Billed
    once, every test's calls go four at once, as a week of a known price does."""
    fast = server.env({**episodic, "EPISODIC_FAKE_DELAY_MS": "0"})
    key = "cancel-tests-price"
    allocated = run_cli(
        ["allocate", "--key", key, "--week", "2026-W01", "--json"],
        fast,
        PROJECT,
        program="episodic",
        check=True,
    )
    episode_id = json.loads(allocated.stdout)["episode_id"]
    for args in (
        ["plan", episode_id, "--playlist", str(PLAYLIST)],
        ["generate", episode_id, "--only", "v01"],
    ):
        run_cli(args, fast, PROJECT, program="episodic", check=True, timeout=120)


# ------------------------------------------------------------------ the provider's side
def _jobs(home: Path) -> dict[str, dict[str, Any]]:
    """The fake provider's jobs (remote ref -> job), read from its own files."""
    folder = home / "fake-provider"
    return {path.stem: json.loads(path.read_text()) for path in sorted(folder.glob("fake-*.json"))}


def _canceled(home: Path) -> set[str]:
    return {path.stem for path in (home / "fake-provider").glob("fake-*.canceled")}


def _wait_for_cancelled(home: Path, jobs: set[str], timeout: float = 120) -> None:
    """Until every one of `jobs` is cancelled at the provider: the flow's cancellation hook (or
    the worker's, when the process could not) settles them after the run reads CANCELLED, which
    takes longer than a fixed pause on a loaded machine."""
    deadline = time.monotonic() + timeout
    while not _canceled(home) >= jobs:
        missing = jobs - _canceled(home)
        assert time.monotonic() < deadline, f"never cancelled at the provider: {sorted(missing)}"
        time.sleep(0.2)


def _wait_for_recorded(database_url: str, refs: set[str], timeout: float = 120) -> None:
    """Until the ledger records each of `refs` as accepted. The provider makes a job before
    the run writes its acceptance; a process frozen between the two leaves a submission whose
    outcome is unknown, which no cancel may ask about (nobody knows its job), so a test that
    expects the cancel to reach every job freezes only after this."""
    engine = sqlalchemy.create_engine(database_url)
    query = sqlalchemy.text(
        "SELECT count(*) FROM submissions WHERE state = 'accepted' AND remote_ref IN :refs"
    ).bindparams(sqlalchemy.bindparam("refs", expanding=True))
    deadline = time.monotonic() + timeout
    try:
        while True:
            with engine.connect() as connection:
                recorded = connection.execute(query, {"refs": sorted(refs)}).scalar_one()
            if recorded == len(refs):
                return
            assert time.monotonic() < deadline, f"{recorded} of {len(refs)} jobs recorded"
            time.sleep(0.2)
    finally:
        engine.dispose()


def _wait_for_jobs(home: Path, count: int, before: set[str], timeout: float = 120) -> set[str]:
    deadline = time.monotonic() + timeout
    while len(new := set(_jobs(home)) - before) < count:
        assert time.monotonic() < deadline, f"the provider made {len(new)} jobs, not {count}"
        time.sleep(0.2)
    return new


# ------------------------------------------------------------------ the server's side
def _cancel(server: PrefectServer, flow_run_id: str) -> None:
    """What the UI's Cancel button does."""
    api_request(
        server,
        "POST",
        f"/flow_runs/{flow_run_id}/set_state",
        json={"state": {"type": "CANCELLING", "name": "Cancelling"}, "force": True},
    )


def _logs(server: PrefectServer, flow_run_ids: list[str]) -> list[str]:
    body = {"logs": {"flow_run_id": {"any_": flow_run_ids}}, "sort": "TIMESTAMP_ASC", "limit": 200}
    return [
        str(entry["message"]) for entry in api_request(server, "POST", "/logs/filter", json=body)
    ]


def _artifacts(server: PrefectServer, key: str) -> list[dict[str, Any]]:
    body = {"artifacts": {"key": {"any_": [key]}}, "sort": "CREATED_DESC", "limit": 50}
    return list(api_request(server, "POST", "/artifacts/filter", json=body))


def _latest_cost(server: PrefectServer, episode_id: str) -> dict[str, Any]:
    key = f"episode-{episode_id.lower()}-cost"
    latest = api_request(server, "GET", f"/artifacts/{key}/latest")
    rows = json.loads(latest["data"]) if isinstance(latest["data"], str) else latest["data"]
    return dict(rows[0])


def _children(server: PrefectServer, parent_id: str) -> list[dict[str, Any]]:
    """The subflow runs of a flow run (through their tracking task runs)."""
    tasks = api_request(
        server,
        "POST",
        "/task_runs/filter",
        json={"flow_runs": {"id": {"any_": [parent_id]}}, "limit": 200},
    )
    ids = [t["id"] for t in tasks]
    if not ids:
        return []
    body = {"flow_runs": {"parent_task_run_id": {"any_": ids}}, "limit": 50}
    return list(api_request(server, "POST", "/flow_runs/filter", json=body))


def _task_runs(server: PrefectServer, flow_run_id: str) -> list[dict[str, Any]]:
    body = {"flow_runs": {"id": {"any_": [flow_run_id]}}, "limit": 200}
    return list(api_request(server, "POST", "/task_runs/filter", json=body))


def _wait_for_child(server: PrefectServer, parent_id: str, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while not (children := _children(server, parent_id)):
        assert time.monotonic() < deadline, "the weekly run never started its generate subflow"
        time.sleep(0.5)
    return children[0]


def _episodic(stack: dict[str, Any], *args: str) -> Any:
    done = run_cli(
        [*args, "--json"],
        stack["server"].env(stack["env"]),
        PROJECT,
        program="episodic",
        timeout=120,
    )
    return done


def _plan(stack: dict[str, Any], week: str) -> None:
    """The week's episode 0, planned by the weekly deployment without generating."""
    planned = create_flow_run(
        stack["server"],
        stack["deployments"]["weekly"],
        parameters={
            "week": week,
            "pipeline": "weekly",
            "playlist": str(PLAYLIST),
            "generate": False,
        },
    )
    wait_for_flow_run(stack["server"], planned["id"], ("COMPLETED",), timeout=120)


def _settled_answer(logs: list[str]) -> None:
    text = "\n".join(logs)
    assert "Traceback" not in text, text
    assert any("cancelled at the provider" in line for line in logs), text
    assert any("still billing" in line for line in logs), text
    assert any("episodic" in line and ("generate" in line or "runs" in line) for line in logs)


# ------------------------------------------------------------------ the tests
def test_cancelling_the_weekly_run_cancels_its_accepted_jobs_at_the_provider(
    stack: dict[str, Any],
) -> None:
    server, home = stack["server"], stack["home"]
    before = set(_jobs(home))
    run = create_flow_run(
        server,
        stack["deployments"]["weekly"],
        parameters={
            "week": "2026-W32",
            "pipeline": "weekly",
            "playlist": str(PLAYLIST),
            "wait_for_approval": False,
        },
    )
    bought = _wait_for_jobs(home, CONCURRENCY, before)
    child = _wait_for_child(server, run["id"])
    _cancel(server, run["id"])
    wait_for_flow_run(server, run["id"], ("CANCELLED",), timeout=120)
    time.sleep(2)  # a job the provider would make after the cancel would show by now
    made = set(_jobs(home)) - before
    assert made == bought  # nothing bought after the cancel
    _wait_for_cancelled(home, made)  # every accepted job was cancelled at the provider
    _settled_answer(_logs(server, [run["id"], child["id"]]))
    cost = _latest_cost(server, "2026-W32-0")
    assert cost["paid calls"] == len(made), cost
    assert cost["still running"] == 0, cost
    assert cost["cancelled at the provider"] == len(made), cost
    assert read_flow_run(server, child["id"])["state_type"] == "CANCELLED"
    checked = _episodic(stack, "check", "2026-W32-0")
    assert checked.returncode == 0, checked.stdout + checked.stderr  # nothing left red


def test_cancelling_a_generate_run_cancels_its_accepted_jobs(stack: dict[str, Any]) -> None:
    server, home = stack["server"], stack["home"]
    _plan(stack, "2026-W33")
    before = set(_jobs(home))
    run = create_flow_run(
        server, stack["deployments"]["generate"], parameters={"episode_id": "2026-W33-0"}
    )
    bought = _wait_for_jobs(home, CONCURRENCY, before)
    _cancel(server, run["id"])
    wait_for_flow_run(server, run["id"], ("CANCELLED",), timeout=120)
    time.sleep(2)
    made = set(_jobs(home)) - before
    assert made == bought
    _wait_for_cancelled(home, made)
    _settled_answer(_logs(server, [run["id"]]))
    cost = _latest_cost(server, "2026-W33-0")
    assert cost["paid calls"] == len(made), cost
    assert cost["still running"] == 0, cost


def test_after_kill_9_the_sweep_crashes_the_flow_and_task_runs_left_running(
    stack: dict[str, Any],
) -> None:
    server, home, worker = stack["server"], stack["home"], stack["worker"]
    before = set(_jobs(home))
    run = create_flow_run(
        server,
        stack["deployments"]["weekly"],
        parameters={
            "week": "2026-W34",
            "pipeline": "weekly",
            "playlist": str(PLAYLIST),
            "wait_for_approval": False,
        },
    )
    bought = _wait_for_jobs(home, CONCURRENCY, before)
    child = _wait_for_child(server, run["id"])
    deadline = time.monotonic() + 60
    while not [t for t in _task_runs(server, child["id"]) if t["state_type"] == "RUNNING"]:
        assert time.monotonic() < deadline, "no item task run ever ran"
        time.sleep(0.2)
    flow_run_processes = [
        p for p in pids_with_env(WORKER_TOKEN_VAR, worker.token) if p != worker.pid
    ]
    assert flow_run_processes
    for pid in flow_run_processes:
        os.kill(pid, signal.SIGKILL)
    time.sleep(3)  # the worker sees its flow-run process exit
    ghosts = [t for t in _task_runs(server, child["id"]) if t["state_type"] == "RUNNING"]
    assert read_flow_run(server, child["id"])["state_type"] == "RUNNING" and ghosts  # before
    time.sleep(float(stack["env"]["EPISODIC_LEASE_S"]) + 2)  # the run's lease expires

    sweep = create_flow_run(server, stack["deployments"]["sweep"])
    wait_for_flow_run(server, sweep["id"], ("COMPLETED",), timeout=120)

    crashed = read_flow_run(server, child["id"])
    assert crashed["state_type"] == "CRASHED", crashed["state"]
    message = crashed["state"]["message"]
    left = bought - _canceled(home)
    assert left == bought  # the provider still holds the bought jobs: nobody cancelled them
    assert f"left at the provider: {len(left)} accepted jobs" in message, message
    assert "finish with: episodic runs resume " in message, message
    for flow_run_id in (run["id"], child["id"]):
        still = [t["name"] for t in _task_runs(server, flow_run_id) if t["state_type"] == "RUNNING"]
        assert still == [], still
    assert read_flow_run(server, run["id"])["state_type"] in ("CRASHED", "FAILED")
    # A second sweep finds nothing more to finalize.
    again = create_flow_run(server, stack["deployments"]["sweep"])
    done = wait_for_flow_run(server, again["id"], ("COMPLETED",), timeout=120)
    assert done["state_type"] == "COMPLETED"


def test_the_workers_cancel_hook_settles_when_the_process_could_not(
    stack: dict[str, Any],
) -> None:
    """The flow-run process is frozen (SIGSTOP) when the cancel comes: it never runs its own
    SIGTERM path, the worker kills it after its 30 s grace, and the `on_cancellation` hook
    the worker then runs is what cancels the accepted jobs at the provider."""
    server, home, worker = stack["server"], stack["home"], stack["worker"]
    planned = create_flow_run(
        server,
        stack["deployments"]["weekly"],
        parameters={
            "week": "2026-W35",
            "pipeline": "weekly",
            "playlist": str(PLAYLIST),
            "generate": False,
        },
    )
    wait_for_flow_run(server, planned["id"], ("COMPLETED",), timeout=120)
    before = set(_jobs(home))
    run = create_flow_run(
        server, stack["deployments"]["generate"], parameters={"episode_id": "2026-W35-0"}
    )
    bought = _wait_for_jobs(home, CONCURRENCY, before)
    _wait_for_recorded(stack["env"]["EPISODIC_DATABASE_URL"], bought)
    frozen = [p for p in pids_with_env(WORKER_TOKEN_VAR, worker.token) if p != worker.pid]
    assert frozen
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    _cancel(server, run["id"])
    wait_for_flow_run(server, run["id"], ("CANCELLED",), timeout=180)
    made = set(_jobs(home)) - before
    assert made == bought
    _wait_for_cancelled(home, made)
    logs = _logs(server, [run["id"]])
    assert any(f"cancelled at the provider: {len(made)} jobs: " in line for line in logs), logs
    _settled_answer(logs)
    cost = _latest_cost(server, "2026-W35-0")
    assert cost["paid calls"] == len(made) and cost["still running"] == 0, cost


def test_cancelling_one_of_two_joined_generate_runs_keeps_the_others_jobs(
    stack: dict[str, Any],
) -> None:
    """Two generate runs of one episode join one run (dedup). A Cancel of the second must
    not cancel at the provider the jobs the first, live flow run is collecting (the first
    would end Failed with tracebacks): it leaves them to the live flow run and says so;
    cancelling that one settles them."""
    server, home = stack["server"], stack["home"]
    _plan(stack, "2026-W34")
    before = set(_jobs(home))
    params = {"episode_id": "2026-W34-0"}
    first = create_flow_run(server, stack["deployments"]["generate"], parameters=params)
    bought = _wait_for_jobs(home, CONCURRENCY, before)
    second = create_flow_run(server, stack["deployments"]["generate"], parameters=params)
    wait_for_flow_run(server, second["id"], ("RUNNING",), timeout=120)
    time.sleep(3)  # the second has joined the first's run and linked itself to it
    _cancel(server, second["id"])
    wait_for_flow_run(server, second["id"], ("CANCELLED",), timeout=120)
    time.sleep(2)
    assert not (_canceled(home) & bought)  # the live run's jobs still run at the provider
    assert read_flow_run(server, first["id"])["state_type"] == "RUNNING"
    logs = _logs(server, [second["id"]])
    assert any("left for it to collect" in line for line in logs), logs
    _cancel(server, first["id"])  # now nobody collects them: the cancel settles them
    wait_for_flow_run(server, first["id"], ("CANCELLED",), timeout=120)
    _wait_for_cancelled(home, bought)
