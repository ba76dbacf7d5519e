"""Steps `prefect.yaml` runs: `setup` when deploying, `project_directory` on the worker.

Both are plain functions Prefect imports by name, so a worker needs only this package
installed (e.g. `uv sync` in a clone or a shared folder); nothing about the deploying
machine is baked into the deployment.
"""

from __future__ import annotations

import atexit
import os
import sys
from pathlib import Path
from typing import Any


def setup(pipeline: str | None = None, work_pool: str | None = None) -> dict[str, Any]:
    """Build step: `episodic prefect setup` for the deploying machine's configuration.

    Returns ``{timezone, version, pipeline}`` for templating the deployments (the weekly
    schedules use the pipeline's recorded timezone). Raises what `prefect_setup` raises,
    which stops `prefect deploy` with a non-zero exit. Its warnings (two deployments of the
    weekly flow scheduling the pipeline) go to standard error, in `prefect deploy`'s output.

    Prefect runs a deployment's build steps before it registers that deployment and tells a
    step nothing about it (its inputs are templated from earlier steps' outputs, blocks,
    variables and the environment only), so the deploy that creates a second deployment
    scheduling a pipeline is not seen here: when the deploying process exits, after Prefect
    registered what it deployed, the step looks again and warns of every deployment this
    deploy added to a pipeline that now has more than one ("this deploy adds a second
    deployment scheduling pipeline P (FLOW/DEPLOYMENT): ...").
    """
    import episodic.tasks  # noqa: F401  (Prefect defaults before anything else)
    from episodic.core.settings import load_settings
    from episodic.deployments.setup import prefect_setup, schedulers_by_pipeline

    result = prefect_setup(pipeline, mode="deploy", work_pool=work_pool)
    for warning in result["warnings"]:
        _warn(warning)
    global _watching
    if not _watching:  # `prefect deploy --all` runs the step once per deployment
        _watching = True
        default_pipeline = load_settings().pipeline
        atexit.register(
            _warn_of_added_schedulers, schedulers_by_pipeline(default_pipeline), default_pipeline
        )
    return {
        "timezone": result["timezone"],
        "version": result["version"],
        "pipeline": result["pipeline"],
    }


_watching = False
_said: set[str] = set()  # `prefect deploy --all` runs the step once per deployment


def _warn(warning: str) -> None:
    """A warning on standard error, once per deploying process."""
    if warning in _said:
        return
    _said.add(warning)
    print(f"episodic: warning: {warning}", file=sys.stderr, flush=True)


def _warn_of_added_schedulers(before: dict[str, list[str]], default_pipeline: str) -> None:
    """At the deploying process's exit: warn of the deployments it added to a pipeline's
    schedulers, once the pipeline has more than one. Never raises (the deploy is done)."""
    try:
        from episodic.deployments.setup import schedulers_by_pipeline

        after = schedulers_by_pipeline(default_pipeline)
    except Exception as exc:  # the server went away, ...: say so, the deploy's result stands
        _warn(
            "could not check which deployments of the weekly flow schedule each pipeline "
            f"after this deploy ({type(exc).__name__}); run `episodic prefect setup`"
        )
        return
    for warning in added_scheduler_warnings(before, after):
        _warn(warning)


def added_scheduler_warnings(
    before: dict[str, list[str]], after: dict[str, list[str]]
) -> list[str]:
    """One warning per pipeline that ``after`` (`schedulers_by_pipeline` once a deploy is
    done) has more than one scheduler of, some of them not in ``before`` (added by it)."""
    from episodic.deployments.setup import multiple_schedulers_warning

    warnings = []
    for pipeline, schedulers in sorted(after.items()):
        added = [name for name in schedulers if name not in before.get(pipeline, [])]
        if len(schedulers) < 2 or not added:
            continue
        if len(added) == 1:
            nth = _ORDINALS.get(len(schedulers), f"{len(schedulers)}th")
            what = f"a {nth} deployment"
        else:
            what = f"{len(added)} deployments"
        warnings.append(
            f"this deploy adds {what} scheduling pipeline {pipeline} ({', '.join(added)}): "
            + multiple_schedulers_warning(pipeline, schedulers)
        )
    return warnings


_ORDINALS = {2: "second", 3: "third", 4: "fourth", 5: "fifth"}


def project_directory() -> dict[str, str]:
    """Pull step: work in the project folder of the worker's own installation.

    The folder is EPISODIC_PROJECT_DIR when the worker sets it (a shared folder, a clone
    elsewhere, or the team's own repository holding the `prefect.yaml` that `episodic init`
    wrote), else the folder this package is installed from (an editable install such as
    `uv sync` in a clone). Relative parameters (the weekly playlist) then mean the same as on
    the command line; the state folder is the project's wherever a process starts
    (`episodic.core.home`). Raises `FileNotFoundError` naming the folder when it is not a project
    folder, or the value when it is relative.
    """
    configured = os.environ.get("EPISODIC_PROJECT_DIR")
    folder = Path(configured).expanduser() if configured else Path(__file__).resolve().parents[1]
    if not folder.is_absolute():  # it would follow the worker's working directory
        message = (
            f"EPISODIC_PROJECT_DIR {configured!r} is relative: set it in the worker's "
            "environment to the project folder's absolute path"
        )
        _fail_flow_run(message)
        raise FileNotFoundError(message)
    from episodic.core.home import is_project_folder

    if not is_project_folder(folder):
        unset = "" if configured else " (EPISODIC_PROJECT_DIR is unset)"
        message = (
            f"{folder} is not an episodic project folder{unset}: neither a checkout nor a "
            "repository whose prefect.yaml runs episodic's flows; set EPISODIC_PROJECT_DIR in "
            "the worker's environment to the project folder"
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
