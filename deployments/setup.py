"""`episodic prefect setup`: everything the flows need on the Prefect side, idempotently.

Run by `episodic serve` before serving and by the `prefect deploy` build step, so neither
path can forget a piece: the schema and the pipeline's recorded timezone (which the weekly
schedules are generated from), the provider profiles' limits (held by the database's
claims), the work pool for `prefect deploy`, the result storage block of a remote media
store (`tasks.results.ensure_result_storage`), and a check that the result storage loads. It
also refuses to let `serve` and `prefect deploy` silently take over each other's deployments,
and warns when more than one deployment of the weekly flow schedules the pipeline (each slot
is still one episode, paid once; but the copies are noise in the UI and a sign of a mistake).
"""

from __future__ import annotations

from typing import Any, Literal

from prefect.client.orchestration import get_client
from prefect.exceptions import ObjectNotFound

from episodic.core.errors import ProviderConfigError
from episodic.core.settings import Settings, load_settings, validate_pipeline
from episodic.deployments.notify import ensure_notifications
from episodic.deployments.spec import WORK_POOL, deployment_specs, project_version, weekly_spec
from episodic.pipeline.pipelines import pipeline_config
from episodic.providers.profiles import configured_profiles
from episodic.storage.registry import engine_for
from episodic.tasks.results import ensure_result_storage

Mode = Literal["serve", "deploy"]


def prefect_setup(
    pipeline: str | None = None,
    *,
    mode: Mode | None = None,
    work_pool: str | None = None,
    settings: Settings | None = None,
    notify: str | None = None,
    approval_wait_s: int = 4 * 3600,
) -> dict[str, Any]:
    """Create or update what the flows rely on; returns what it found and did.

    Shape: ``{pipeline, timezone, version, limits: [{profile, limit}], work_pool,
    result_storage, warnings: [str], notifications: [{name, id, changed}]}``. `notify`: the
    name of a notification block the automations of `episodic.deployments.notify` send through (an
    approval waiting `approval_wait_s`, a failed flow run); None: no automation is touched.
    Raises `TimezoneMismatch` (this process's EPISODIC_TIMEZONE differs from the recorded
    one) and `ProviderConfigError` (a deployment of ours is registered the other way, a
    result storage block that does not load).
    """
    settings = settings or load_settings()
    name = validate_pipeline(pipeline or settings.pipeline)
    config = pipeline_config(engine_for(settings), settings, name)
    limits = [  # enforced by the claims in the database (no Prefect limit to create)
        {"profile": profile.id, "limit": profile.max_concurrency}
        for profile in configured_profiles(settings).values()
    ]
    if work_pool:
        _ensure_process_pool(work_pool)
    storage = ensure_result_storage(settings)  # a typo fails here, not mid-run
    notifications = ensure_notifications(name, notify, approval_wait_s) if notify else []
    if mode is not None:
        _refuse_takeover(mode, name)
    schedulers = scheduling_deployments(name, settings.pipeline)
    warnings = [] if len(schedulers) < 2 else [multiple_schedulers_warning(name, schedulers)]
    return {
        "pipeline": name,
        "timezone": config.timezone,
        "version": project_version(),
        "limits": limits,
        "work_pool": work_pool,
        "result_storage": storage,
        "warnings": warnings,
        "notifications": notifications,
    }


def scheduling_deployments(pipeline: str, default_pipeline: str) -> list[str]:
    """The deployments of the weekly flow (``flow/deployment``) whose active schedules feed
    ``pipeline``: its ``pipeline`` parameter, else the EPISODIC_PIPELINE of its job
    variables, else ``default_pipeline`` (this process's, the best guess for a worker's)."""
    return schedulers_by_pipeline(default_pipeline).get(pipeline, [])


def schedulers_by_pipeline(default_pipeline: str) -> dict[str, list[str]]:
    """Every pipeline some active schedule of a weekly-flow deployment feeds, with those
    deployments (``flow/deployment``, sorted); as `scheduling_deployments`."""
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    flow_name = weekly_spec().flow_name
    with get_client(sync_client=True) as client:
        deployments = client.read_deployments(
            flow_filter=FlowFilter(name=FlowFilterName(any_=[flow_name]))
        )
    fed_by: dict[str, list[str]] = {}
    for deployment in deployments:
        if deployment.paused or not any(s.active for s in deployment.schedules):
            continue
        env = (deployment.job_variables or {}).get("env") or {}
        fed = (
            (deployment.parameters or {}).get("pipeline")
            or (env.get("EPISODIC_PIPELINE") if isinstance(env, dict) else None)
            or default_pipeline
        )
        fed_by.setdefault(str(fed), []).append(f"{flow_name}/{deployment.name}")
    return {pipeline: sorted(names) for pipeline, names in fed_by.items()}


def multiple_schedulers_warning(pipeline: str, deployments: list[str]) -> str:
    return (
        f"pipeline {pipeline} is scheduled by {len(deployments)} deployments of the weekly "
        f"flow ({', '.join(deployments)}): each slot is one episode whichever of them runs "
        "it, and is paid for once, but keep one of them (`prefect deployment delete "
        "FLOW/DEPLOYMENT` for the others)"
    )


def _ensure_process_pool(name: str) -> None:
    from prefect.client.schemas.actions import WorkPoolCreate

    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(name)
        except ObjectNotFound:
            client.create_work_pool(WorkPoolCreate(name=name, type="process"))


def _refuse_takeover(mode: Mode, pipeline: str) -> None:
    """`serve` and `prefect deploy` register the same names; each refuses to overwrite a
    deployment the other one owns (served ones have no work pool), or one registered for
    another pipeline (its `pipeline:` tag)."""
    with get_client(sync_client=True) as client:
        for spec in deployment_specs():
            try:
                existing = client.read_deployment_by_name(spec.full_name)
            except ObjectNotFound:
                continue
            other = [
                t.split(":", 1)[1]
                for t in existing.tags or []
                if t.startswith("pipeline:") and t != f"pipeline:{pipeline}"
            ]
            if other:
                raise ProviderConfigError(
                    f"deployment {spec.full_name} is registered for pipeline {other[0]}; "
                    f"registering pipeline {pipeline} would take it over: serve or deploy one "
                    "pipeline per Prefect server, or remove it first with "
                    f"`prefect deployment delete {spec.full_name}`"
                )
            pool = existing.work_pool_name
            if mode == "serve" and pool:
                raise ProviderConfigError(
                    f"deployment {spec.full_name} is registered for work pool {pool!r} "
                    "(prefect deploy); serving would take it over: remove it first with "
                    f"`prefect deployment delete {spec.full_name}`"
                )
            if mode == "deploy" and not pool:
                raise ProviderConfigError(
                    f"deployment {spec.full_name} is served by `episodic serve`; deploying "
                    "would take it over: stop serve and remove it first with "
                    f"`prefect deployment delete {spec.full_name}`"
                )


__all__ = ["WORK_POOL", "prefect_setup"]
