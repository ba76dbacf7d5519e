"""The generate flow's task runner, from configuration (EPISODIC_TASK_RUNNER).

``threads`` (default): Prefect's `ThreadPoolTaskRunner` with EPISODIC_TASK_RUNNER_THREADS
threads in the flow's process (a run's `concurrency` decides how many items are in flight).
``dask``: `prefect_dask.DaskTaskRunner` on the cluster at EPISODIC_DASK_ADDRESS (items run on
its workers, on any machine that has the project installed and the same EPISODIC_* settings),
or on a temporary local cluster when no address is set. Item tasks carry ids only, so
either runner works the same.
"""

from __future__ import annotations

from typing import Any

from prefect.task_runners import ThreadPoolTaskRunner

from episodic.core.errors import InvalidInput
from episodic.core.settings import Settings, load_settings


def task_runner_for(settings: Settings) -> Any:
    if settings.task_runner == "dask":
        from prefect_dask.task_runners import DaskTaskRunner

        if settings.dask_address:
            return DaskTaskRunner(address=settings.dask_address)
        return DaskTaskRunner()
    return ThreadPoolTaskRunner(max_workers=settings.task_runner_threads)


def configured_task_runner() -> Any:
    """The runner for the flow decorator (read when the flow module is imported; a bad
    setting falls back to threads here and fails the run itself with its message)."""
    try:
        return task_runner_for(load_settings())
    except InvalidInput:
        return ThreadPoolTaskRunner(max_workers=64)
