"""Steps `prefect.yaml` runs: `setup` when deploying, `project_directory` on the worker.

Both are plain functions Prefect imports by name, so a worker needs only this package
installed (e.g. `uv sync` in a clone or a shared folder); nothing about the deploying
machine is baked into the deployment.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def setup(pipeline: str | None = None, work_pool: str | None = None) -> dict[str, Any]:
    """Build step: `episodic prefect setup` for the deploying machine's configuration.

    Returns ``{timezone, version, pipeline}`` for templating the deployments (the weekly
    schedules use the pipeline's recorded timezone). Raises what `prefect_setup` raises,
    which stops `prefect deploy` with a non-zero exit. Its warnings (two deployments of the
    weekly flow scheduling the pipeline) go to standard error, in `prefect deploy`'s output.
    """
    import sys

    import tasks  # noqa: F401  (Prefect defaults before anything else)
    from deployments.setup import prefect_setup

    result = prefect_setup(pipeline, mode="deploy", work_pool=work_pool)
    for warning in result["warnings"]:
        print(f"episodic: warning: {warning}", file=sys.stderr, flush=True)
    return {
        "timezone": result["timezone"],
        "version": result["version"],
        "pipeline": result["pipeline"],
    }


def project_directory() -> dict[str, str]:
    """Pull step: work in the project folder of the worker's own installation.

    The folder is EPISODIC_PROJECT_DIR when the worker sets it (a shared folder or a clone
    elsewhere), else the folder this package is installed from (an editable install such as
    `uv sync` in a clone). Relative settings and parameters (EPISODIC_HOME=.episodic, the
    weekly playlist) then mean the same as on the command line. Raises `FileNotFoundError`
    naming the folder when it is not a project folder.
    """
    configured = os.environ.get("EPISODIC_PROJECT_DIR")
    folder = Path(configured).expanduser() if configured else Path(__file__).resolve().parents[1]
    if not (folder / "flows").is_dir():
        message = (
            f"{folder} is not an episodic project folder (no flows/ in it): set "
            "EPISODIC_PROJECT_DIR in the worker's environment to the project folder"
        )
        _fail_flow_run(message)
        raise FileNotFoundError(message)
    os.chdir(folder)
    return {"directory": str(folder)}


def _fail_flow_run(message: str) -> None:
    """Put the reason on the flow run itself (the UI shows the state message), not only in
    the worker's output: the pull step runs before the flow's logger exists."""
    flow_run_id = os.environ.get("PREFECT__FLOW_RUN_ID")
    if not flow_run_id:
        return
    try:
        from prefect.client.orchestration import get_client
        from prefect.states import Failed

        with get_client(sync_client=True) as client:
            client.set_flow_run_state(flow_run_id, Failed(message=message), force=True)
    except Exception:  # the step fails anyway; the worker's output has the message
        return
