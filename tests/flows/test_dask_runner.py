"""Items run anywhere: a generation on a `distributed.LocalCluster` of two worker
processes against PostgreSQL. Item tasks carry ids only; each worker process rebuilds its
engine from the database and the environment. Counted at the fake provider's own log."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sqlalchemy import create_engine

from episodic.core.ids import WeekId
from episodic.flows.generate import generate_episode
from episodic.pipeline.allocation import allocate
from tests.flows.test_generate_flow import plan
from tests.generation import jobs_per_key, provider_log

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_items_run_on_a_dask_cluster_of_two_worker_processes(
    harness: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from distributed import Client, LocalCluster
    from prefect_dask.task_runners import DaskTaskRunner

    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))
    monkeypatch.setenv("EPISODIC_FAKE_DELAY_MS", "100")
    engine = create_engine(harness)
    episode_id = str(
        allocate(engine, "weekly", WeekId.parse("2026-W32"), "dask").episode.episode_id
    )
    engine.dispose()
    plan(harness, episode_id, tmp_path / "p", [f"t{n}" for n in range(12)])
    with LocalCluster(
        n_workers=2, threads_per_worker=2, processes=True, dashboard_address=None
    ) as cluster:  # the workers inherit this environment (database, home, provider log)
        with Client(cluster) as client:
            workers = set(client.run(os.getpid).values())
        on_dask = generate_episode.with_options(
            task_runner=DaskTaskRunner(address=cluster.scheduler_address)
        )
        result = on_dask(episode_id=episode_id, concurrency=4)
    assert result["state"] == "completed" and result["completed"] == 12
    assert len(jobs_per_key()) == 12 and set(jobs_per_key().values()) == {1}
    paid_in = {e["pid"] for e in provider_log() if e["event"] == "job_created"}
    assert paid_in <= workers and os.getpid() not in paid_in  # on the cluster, not here
    assert len(paid_in) == 2  # both worker processes took items
    results = Path(os.environ["EPISODIC_HOME"]) / "results"
    assert len(list(results.iterdir())) >= 12  # the configured result storage
