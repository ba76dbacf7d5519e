"""The weekly pipeline as Prefect users run it, end to end on real processes.

A real `prefect server` on a free loopback port, the project's own deploy configuration
(`episodic db upgrade`, `episodic prefect setup`, then `prefect deploy --all` from the
project folder with no hidden variables), a process work pool with **two** `prefect worker`
processes, episodes in the local PostgreSQL, the fake provider's own log as the bill. One
story, in order:

1. the server's scheduler endpoint creates the runs of both weekly slots (Mon + Thu 09:00
   Europe/Berlin, the timezone recorded for the pipeline), and a duplicate of the first slot
   is dispatched: two episodes, the duplicate owns the first's and ends green (Joined);
2. each slot run suspends at its approval form; an empty reviewer is refused by the server
   and the run waits on; a valid answer resumes it, the worker assembles;
3. a manual run gets a new episode;
4. a generate run cancelled from the API pauses; `episodic dispatch generate` finishes it;
5. across everything the provider made exactly one job per item;
6. a worker whose EPISODIC_TIMEZONE disagrees with the recorded zone refuses.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.databases import PostgresDatabases, require_postgres
from tests.e2e.stack import (
    PrefectServer,
    StackError,
    Worker,
    api_request,
    create_flow_run,
    flow_runs_of_deployment,
    read_deployment,
    read_flow_run,
    run_cli,
    trigger_scheduler,
    wait_for_flow_run,
    wait_for_flow_runs,
)
from tests.e2e.webhook import SAVE_BLOCK, hook, wait_for
from tests.generation import item_key_of

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.postgres]

PROJECT = Path(__file__).resolve().parents[2]
BERLIN = dt.timezone(dt.timedelta(hours=1))  # November: CET
WEEK_46 = dt.datetime(2026, 11, 9, tzinfo=BERLIN)  # Monday of 2026-W46
PLANNED_ITEMS = 14  # examples/playlist.yaml


def _log(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def _jobs_per_item(path: Path) -> Counter[str]:
    """Jobs the provider made, per item key (its own log, never our tables)."""
    return Counter(
        item_key_of(e["client_reference"]) for e in _log(path) if e["event"] == "job_created"
    )


def _billed_jobs_per_item(path: Path, home: Path) -> Counter[str]:
    """Jobs the provider made and did not cancel (a cancelled fake job is not billed), per
    item key: its log, and its own cancel markers."""
    cancelled = {p.stem for p in (home / "fake-provider").glob("fake-*.canceled")}
    return Counter(
        item_key_of(e["client_reference"])
        for e in _log(path)
        if e["event"] == "job_created" and e["remote_ref"] not in cancelled
    )


def _episodes(url: str) -> dict[str, tuple[str, str]]:
    from episodic.storage.engine import make_engine
    from episodic.storage.episodes import EpisodeRepository

    engine = make_engine(url)
    try:
        return {
            str(e.episode_id): (e.allocation_key, str(e.state))
            for e in EpisodeRepository(engine).list("weekly")
        }
    finally:
        engine.dispose()


def _resume(server: PrefectServer, flow_run_id: str, answer: dict[str, Any]) -> str:
    result = api_request(
        server, "POST", f"/flow_runs/{flow_run_id}/resume", json={"run_input": answer}
    )
    return str(result["status"])


@pytest.fixture
def databases() -> Any:
    require_postgres()
    databases = PostgresDatabases()
    try:
        yield databases
    finally:
        databases.close()


@pytest.fixture
def database(databases: PostgresDatabases) -> Any:
    name = databases.fresh(migrated=False)  # `episodic db upgrade` migrates it
    try:
        yield databases.url(name)
    finally:
        databases.drop(name)


@pytest.fixture
def prefect_database(databases: PostgresDatabases) -> Any:
    """An empty database for the Prefect server itself (production runs it on Postgres;
    SQLite answers "database is locked" under two workers)."""
    from sqlalchemy.engine import make_url

    name = databases.fresh(migrated=False)
    try:
        yield (
            make_url(databases.url(name))
            .set(drivername="postgresql+asyncpg")
            .render_as_string(hide_password=False)
        )
    finally:
        databases.drop(name)


def test_weekly_deployments_on_a_server_with_two_workers(
    tmp_path: Path, database: str, prefect_database: str
) -> None:
    provider_log = tmp_path / "provider.jsonl"
    episodic = {
        "EPISODIC_DATABASE_URL": database,
        "EPISODIC_HOME": str(tmp_path / "home"),  # shared by both workers (one machine here)
        "EPISODIC_FAKE_PROVIDER_LOG": str(provider_log),
        "EPISODIC_FAKE_DELAY_MS": "300",
        "EPISODIC_PENDING_TTL_S": str(30 * 24 * 3600),  # backfilled slots are weeks "late"
    }
    with (
        PrefectServer(tmp_path / "stack", database_url=prefect_database) as server,
        hook() as notifications,
    ):
        deployer = server.env({**episodic, "EPISODIC_TIMEZONE": "Europe/Berlin"})
        upgraded = run_cli(["db", "upgrade"], deployer, PROJECT, program="episodic")
        assert upgraded.returncode == 0, upgraded.stderr
        saved = run_cli(
            [SAVE_BLOCK, notifications[0]], deployer, PROJECT, program=[sys.executable, "-c"]
        )
        assert saved.returncode == 0, saved.stderr[-3000:]
        setup = run_cli(
            [
                *("prefect", "setup", "--work-pool", "episodic"),
                *("--notify", "ops", "--approval-wait", "10s", "--json"),
            ],
            deployer,
            PROJECT,
            program="episodic",
        )
        assert setup.returncode == 0, setup.stderr
        assert json.loads(setup.stdout)["timezone"] == "Europe/Berlin"
        deployed = run_cli(["deploy", "--all"], deployer, PROJECT, timeout=300)
        assert deployed.returncode == 0, deployed.stdout[-3000:] + deployed.stderr[-3000:]

        weekly = read_deployment(server, "weekly-episode", "weekly")
        assert weekly["parameters"] == {"pipeline": "weekly", "playlist": "examples/playlist.yaml"}
        assert sorted((s["slug"], s["schedule"]["cron"]) for s in weekly["schedules"]) == [
            ("weekly-monday-0900", "0 9 * * 1"),
            ("weekly-thursday-0900", "0 9 * * 4"),
        ]
        assert {s["schedule"]["timezone"] for s in weekly["schedules"]} == {"Europe/Berlin"}
        assert str(PROJECT) not in json.dumps(weekly)  # nothing of the deploying machine
        generate = read_deployment(server, "generate-episode", "generate")
        schema = generate["parameter_openapi_schema"]
        assert "episode_id" in schema["required"]
        assert schema["properties"]["episode_id"]["pattern"].startswith("^")
        assert schema["properties"]["episode_id"]["description"]
        for flow, name in [
            ("plan-episode", "plan"),
            ("approve-episode", "approve"),
            ("assemble-episode", "assemble"),
            ("sweep", "sweep"),
        ]:
            assert read_deployment(server, flow, name)["version"] == weekly["version"]

        slots = _week_46_slots(server, weekly, prefect_database)  # before a worker takes them
        workers = [
            Worker(server, "episodic", cwd=tmp_path, extra_env=episodic).start() for _ in range(2)
        ]
        try:
            _story(server, weekly, slots, provider_log, database, episodic, notifications[1])
        finally:
            for worker in workers:
                worker.stop()

        # Item results went to the configured default (EPISODIC_HOME/results), also under
        # workers, whose flow-run processes import Prefect before the project does.
        results = tmp_path / "home" / "results"
        assert results.is_dir() and len(list(results.iterdir())) >= 3 * PLANNED_ITEMS
        assert not list((server.client_home / "storage").glob("*"))

        # A worker whose EPISODIC_TIMEZONE disagrees with the recorded zone refuses.
        wrong = {**episodic, "EPISODIC_TIMEZONE": "UTC"}
        with Worker(server, "episodic", cwd=tmp_path, extra_env=wrong):
            run = create_flow_run(
                server, weekly["id"], parameters={"week": "2026-W46", "generate": False}
            )
            failed = wait_for_flow_run(server, run["id"], ("FAILED",), timeout=120)
        message = (failed.get("state") or {}).get("message") or ""
        assert "runs in Europe/Berlin" in message, message
        assert len(_episodes(database)) == 3  # nothing allocated by the refusing worker


def _week_46_slots(
    server: PrefectServer, weekly: dict[str, Any], prefect_database: str
) -> list[dict[str, Any]]:
    """Both weekly slots of week 46, created by the server's scheduler endpoint, dated as the
    scheduler service makes a weekly slot's run: days before it starts.

    Prefect's server inserts scheduled runs without a state event, yet links a run's next
    state event to that Scheduled state when the state is less than five minutes old; its
    triggers service then holds every later event of the run (the Suspended one too) up to
    15 minutes for the missing one. Runs made seconds before they start, as here, would be
    notified that late; so their Scheduled states are dated a day back in the server's
    database, as the scheduler service's runs are."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    end = WEEK_46 + dt.timedelta(days=7)
    runs_now = trigger_scheduler(server, weekly["id"], start_time=WEEK_46, end_time=end)
    slots = [  # the scheduler service has also scheduled the coming weeks: not these
        r for r in runs_now if WEEK_46 <= dt.datetime.fromisoformat(r["expected_start_time"]) < end
    ]
    assert len(slots) == 2, slots
    url = make_url(prefect_database).set(drivername="postgresql+psycopg")
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "UPDATE flow_run_state SET timestamp = timestamp - interval '1 day' "
                    "WHERE flow_run_id = ANY(CAST(:ids AS uuid[]))"
                ),
                {"ids": [r["id"] for r in slots]},
            )
    finally:
        engine.dispose()
    return slots


def _story(
    server: PrefectServer,
    weekly: dict[str, Any],
    slots: list[dict[str, Any]],
    provider_log: Path,
    database: str,
    episodic: dict[str, str],
    notified: list[dict[str, Any]],
) -> None:
    from episodic.core.keys import slot_key as key_of

    # 1. Both slots of week 46, and a duplicate dispatch of the first slot.
    monday, thursday = slots
    slot = dt.datetime.fromisoformat(monday["expected_start_time"])
    slot_key = key_of("weekly", slot)  # the slot's identity: a replay of it
    duplicate = create_flow_run(
        server, weekly["id"], parameters={"allocation_key": slot_key, "week": "2026-W46"}
    )
    runs = [monday["id"], thursday["id"], duplicate["id"]]
    settled = [wait_for_flow_run(server, r, ("PAUSED", "COMPLETED"), timeout=240) for r in runs]
    episodes = _episodes(database)
    assert sorted(episodes) == ["2026-W46-0", "2026-W46-1"], episodes
    by_key = {key: episode for episode, (key, _) in episodes.items()}
    first = by_key[slot_key]  # the duplicate dispatch owns the Monday slot's episode
    first_pair = settled[0], settled[2]
    waiting_first = [r for r in first_pair if r["state_type"] == "PAUSED"]
    joined = [r for r in first_pair if r["state_type"] == "COMPLETED"]
    assert len(waiting_first) == 1 and len(joined) == 1, first_pair  # one form between them
    assert joined[0]["state_name"] == "Joined"
    assert settled[1]["state_type"] == "PAUSED"
    assert first in read_flow_run(server, waiting_first[0]["id"])["name"]
    # Each run's first wait is notified (`--notify ops --approval-wait 10s`), once, at the
    # webhook: the automation matches a tag the run carries from its creation.
    waits = wait_for(notified, "an approval waits", 2)
    names = sorted(str(r["subject"]) for r in waits)
    expected = [read_flow_run(server, r["id"])["name"] for r in (waiting_first[0], settled[1])]
    assert len(waits) == 2 and all(
        any(name in subject for subject in names) for name in expected
    ), (names, expected)

    # 2. The forms: an empty reviewer is refused before the run resumes; approve assembles.
    for run in (waiting_first[0], settled[1]):
        assert _resume(server, run["id"], {"decision": "approve", "reviewer": ""}) != "ACCEPT"
        assert read_flow_run(server, run["id"])["state_type"] == "PAUSED"
        assert _resume(server, run["id"], {"decision": "approve", "reviewer": "ann"}) == "ACCEPT"
    done = wait_for_flow_runs(
        server, [waiting_first[0]["id"], settled[1]["id"]], ("COMPLETED",), timeout=240
    )
    assert [r["state_name"] for r in done] == ["Completed", "Completed"]
    episodes = _episodes(database)
    assert {e: s for e, (_, s) in episodes.items()} == {
        "2026-W46-0": "assembled",
        "2026-W46-1": "assembled",
    }

    # 3. A manual run ("Run" in the UI) gets a new episode.
    manual = create_flow_run(
        server, weekly["id"], parameters={"week": "2026-W46", "generate": False}
    )
    wait_for_flow_run(server, manual["id"], ("COMPLETED",), timeout=120)
    assert "2026-W46-2" in _episodes(database)

    # 4. A generate run cancelled mid-way cancels its accepted jobs at the provider (issue
    # 28); a later dispatch finishes it, buying only what was cancelled or never bought.
    generate = read_deployment(server, "generate-episode", "generate")
    cancelled = create_flow_run(server, generate["id"], parameters={"episode_id": "2026-W46-2"})
    wait_for_flow_run(server, cancelled["id"], ("RUNNING",), timeout=120)
    deadline = time.monotonic() + 120
    while sum(_jobs_per_item(provider_log).values()) <= 2 * PLANNED_ITEMS:  # W46-2 started
        assert time.monotonic() < deadline, "the generate run never reached the provider"
        time.sleep(0.2)
    api_request(
        server,
        "POST",
        f"/flow_runs/{cancelled['id']}/set_state",
        json={"state": {"type": "CANCELLING", "name": "Cancelling"}, "force": True},
    )
    wait_for_flow_run(server, cancelled["id"], ("CANCELLED",), timeout=120)
    dispatched = run_cli(
        ["dispatch", "generate", "2026-W46-2", "--json"],
        server.env(episodic),
        PROJECT,
        program="episodic",
        timeout=120,
    )
    assert dispatched.returncode == 0, dispatched.stderr
    flow_run_id = json.loads(dispatched.stdout)["flow_run_id"]
    try:
        wait_for_flow_run(server, flow_run_id, ("COMPLETED",), timeout=240)
    except StackError:
        pytest.fail(f"dispatch did not finish: {read_flow_run(server, flow_run_id)}")

    # 5. The bill: one billed provider job per item across every run, worker and retry (the
    # jobs the cancel stopped at the provider are the only ones bought again).
    jobs = _billed_jobs_per_item(provider_log, Path(episodic["EPISODIC_HOME"]))
    assert len(jobs) == 3 * PLANNED_ITEMS and set(jobs.values()) == {1}, jobs.most_common(3)
    unfinished = flow_runs_of_deployment(
        server, weekly["id"], state_types=["PENDING", "RUNNING", "PAUSED", "FAILED", "CRASHED"]
    )
    assert unfinished == []
