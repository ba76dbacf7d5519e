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
    which stops `prefect deploy` with a non-zero exit.
    """
    import tasks  # noqa: F401  (Prefect defaults before anything else)
    from flows.setup import prefect_setup

    result = prefect_setup(pipeline, mode="deploy", work_pool=work_pool)
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
        raise FileNotFoundError(
            f"{folder} is not an episodic project folder (no flows/ in it): set "
            "EPISODIC_PROJECT_DIR in the worker's environment to the project folder"
        )
    os.chdir(folder)
    return {"directory": str(folder)}
