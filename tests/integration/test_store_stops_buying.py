"""A run stops buying at its first paid image the media store cannot take.

The store starts failing after a few images (a local folder turned read-only under the run;
an S3 server behind a proxy that answers 503 to everything): the run is paused with the
store's reason, no process of it submits another item, and its accepted jobs stay accepted.
After the store is fixed, one resume collects them at no cost and buys the rest: one
provider job per item, every image in the store with its hash, `episodic check` clean.
Counted from the provider's side (the fake provider's own files and log) and the store's,
on SQLite and PostgreSQL.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from episodic.core.exit_codes import ExitCode
from episodic.core.planning import RunOptions
from episodic.core.records import ItemResult
from episodic.core.runs import Item
from episodic.core.settings import load_settings
from episodic.core.states import RunState
from episodic.pipeline.gate import EnvironmentCredentials
from episodic.pipeline.generation import generate
from episodic.pipeline.outcomes import RunOutcome
from episodic.pipeline.runner import Runner
from tests.acceptance.conftest import EPISODIC
from tests.fault_proxy import FaultProxy
from tests.fs_faults import can_mount, read_only_folder
from tests.generation import (
    Episode,
    generate_in_background,
    image_keys,
    made_jobs_per_key,
    new_episode,
    write_playlist,
)
from tests.s3_server import S3Server

ITEMS = 12
BEFORE_FAULT = 2  # images stored before the store starts failing


@pytest.fixture(autouse=True)
def fake_provider(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))
    monkeypatch.setenv("EPISODIC_FAKE_DELAY_MS", "150")


@pytest.fixture
def episode(engine: Engine, database_url: str, tmp_path: Path) -> Episode:
    made = new_episode(engine)
    made.plan(write_playlist(tmp_path / "p", [f"t{n}" for n in range(ITEMS)]))
    return made


@pytest.fixture
def s3_proxy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultProxy]:
    """A bucket of a moto server of this test's own, reached through a fault proxy."""
    server = S3Server(tmp_path / "s3").start()
    try:
        with FaultProxy(server.endpoint) as proxy:
            for name, value in {**server.env(), "AWS_ENDPOINT_URL": proxy.endpoint}.items():
                monkeypatch.setenv(name, value)
            monkeypatch.setenv("EPISODIC_MEDIA_URL", f"s3://{server.new_bucket()}/media")
            yield proxy
    finally:
        server.stop()


def _rows(engine: Engine, sql: str) -> list[tuple[object, ...]]:
    with engine.connect() as conn:
        return [tuple(row) for row in conn.execute(text(sql)).all()]


def _generate_failing_after(episode: Episode, fail: Callable[[], None]) -> RunOutcome:
    """`generate` of the episode at concurrency 2, `fail()` called once `BEFORE_FAULT`
    images are completed (the store starts failing under the running run)."""
    done: list[Item] = []

    def on_start(runner: Runner, run_id: str) -> None:
        def on_progress(item: Item, result: ItemResult) -> None:
            if result == ItemResult.COMPLETED:
                done.append(item)
                if len(done) == BEFORE_FAULT:
                    fail()

        runner.on_progress = on_progress

    return generate(
        episode.engine,
        load_settings(),
        "weekly",
        episode.episode_id,
        RunOptions(concurrency=2),
        EnvironmentCredentials(),
        on_start=on_start,
    )


def _assert_stopped_buying(episode: Episode, outcome: RunOutcome, store: str) -> None:
    assert outcome.exit_code == ExitCode.INTERRUPTED and outcome.state == RunState.PAUSED
    assert "stopped buying" in outcome.message and store in outcome.message
    assert f"episodic runs resume {outcome.run_id}" in outcome.message
    assert "\n" not in outcome.message
    ((state, why),) = _rows(episode.engine, "SELECT state, error_text FROM runs")
    assert state == "paused" and str(why).startswith("stopped buying: ") and store in str(why)
    jobs = made_jobs_per_key()
    subs = _rows(episode.engine, "SELECT state FROM submissions")
    # what was bought: the images stored before, and those in flight when the store failed
    assert sum(jobs.values()) == len(subs) < ITEMS
    assert set(jobs.values()) == {1}
    completed = _rows(episode.engine, "SELECT count(*) FROM items WHERE state = 'completed'")
    assert completed[0][0] >= BEFORE_FAULT
    assert {s for (s,) in subs} <= {"succeeded", "accepted"}  # nothing settled wrongly
    assert _rows(episode.engine, "SELECT count(*) FROM items WHERE state = 'running'") == [(0,)]


def _assert_one_resume_completes(episode: Episode, run_id: str) -> None:
    again = episode.resume(run_id)
    assert again.exit_code == ExitCode.OK and again.state == RunState.COMPLETED
    jobs = made_jobs_per_key()
    assert len(jobs) == ITEMS and set(jobs.values()) == {1}  # one job per item, ever
    assert len(image_keys(episode.engine)) == ITEMS  # size and sha256 read from the store
    _assert_check_clean(episode)


def _assert_check_clean(episode: Episode) -> None:
    assert EPISODIC is not None
    check = subprocess.run(
        [EPISODIC, "check", episode.episode_id], capture_output=True, text=True, timeout=120
    )
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.skipif(not can_mount(), reason="a read-only mount needs root")
def test_a_local_store_turned_read_only_stops_the_run_and_one_resume_completes_it(
    episode: Episode, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "media"
    folder.mkdir()
    monkeypatch.setenv("EPISODIC_MEDIA_URL", str(folder))
    with contextlib.ExitStack() as sealed:  # a read-only tmpfs over the store's folder
        outcome = _generate_failing_after(
            episode, lambda: sealed.enter_context(read_only_folder(folder))
        )
    # unmounted: the images stored before reappear, and the store takes images again
    assert outcome.run_id is not None
    _assert_stopped_buying(episode, outcome, str(folder))
    _assert_one_resume_completes(episode, outcome.run_id)


def test_an_s3_store_answering_503_stops_the_run_and_one_resume_completes_it(
    episode: Episode, s3_proxy: FaultProxy
) -> None:
    outcome = _generate_failing_after(episode, lambda: setattr(s3_proxy, "failing", True))
    assert outcome.run_id is not None
    _assert_stopped_buying(episode, outcome, os.environ["EPISODIC_MEDIA_URL"])
    assert s3_proxy.counts["503"] + s3_proxy.counts["500"] >= 1  # the store's side
    s3_proxy.failing = False
    _assert_one_resume_completes(episode, outcome.run_id)


def _until(engine: Engine, sql: str, count: int, processes: list[subprocess.Popen[str]]) -> None:
    """Wait until `sql` counts at least `count` while every process still runs."""
    deadline = time.monotonic() + 120
    while _rows(engine, sql)[0][0] < count:
        for process in processes:
            assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, f"never {count}: {sql}"
        time.sleep(0.02)


@pytest.mark.slow
def test_two_cli_processes_of_one_run_both_stop_and_say_so_in_one_line(
    episode: Episode, s3_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two `episodic generate` of the episode share one run; the store fails under them:
    each exits 130 with one line naming the store (no credential) and the resume command,
    and neither buys on; `episodic runs resume RUN` then completes every item."""
    assert EPISODIC is not None
    monkeypatch.setenv("EPISODIC_FAKE_DELAY_MS", "700")  # both processes start meanwhile
    processes = [generate_in_background(episode.episode_id, "--concurrency", "2") for _ in range(2)]
    for process in processes:  # each works on the run (it holds or held a claim of its own)
        mine = f"SELECT count(*) FROM items WHERE claim_owner LIKE '%:{process.pid}:%'"
        _until(episode.engine, mine, 1, processes)
    completed = "SELECT count(*) FROM items WHERE state = 'completed'"
    _until(episode.engine, completed, 1, processes)
    s3_proxy.failing = True
    outputs = [process.communicate(timeout=180) for process in processes]
    ((run_id, state, why),) = _rows(episode.engine, "SELECT id, state, error_text FROM runs")
    assert state == "paused" and str(why).startswith("stopped buying: ")
    store = os.environ["EPISODIC_MEDIA_URL"]
    for process, (out, err) in zip(processes, outputs, strict=True):
        assert process.returncode == ExitCode.INTERRUPTED, (out, err)
        assert not err.strip() and "Traceback" not in out
        line = out.strip().splitlines()[0]  # the outcome's line (then the run's figures)
        assert line.startswith(f"run {run_id} stopped buying: media store {store}")
        assert f"store answers: episodic runs resume {run_id}" in line
        assert os.environ["AWS_SECRET_ACCESS_KEY"] not in out
        assert os.environ["AWS_ACCESS_KEY_ID"] not in out
    jobs = made_jobs_per_key()
    assert set(jobs.values()) == {1} and sum(jobs.values()) < ITEMS
    s3_proxy.failing = False
    resumed = subprocess.run(
        [EPISODIC, "runs", "resume", run_id], capture_output=True, text=True, timeout=300
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    jobs = made_jobs_per_key()
    assert len(jobs) == ITEMS and set(jobs.values()) == {1}
    assert len(image_keys(episode.engine)) == ITEMS
    _assert_check_clean(episode)
