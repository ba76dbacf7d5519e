"""`generate_episode`: a paid generation run from Prefect (deployment, UI, or a parent flow).

The same engine as `episodic generate`; each item runs as a cached `generate_item` task.
Cancelling the flow run pauses the run as Ctrl-C does (Prefect delivers the cancellation as
SIGTERM, raised in the flow as a termination signal that the engine handles): in-flight items
are marked failed ("interrupted"), accepted remote tasks keep their references, and a resume
collects them.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from prefect import flow
from prefect.artifacts import (
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.logging import get_run_logger
from prefect.task_runners import ThreadPoolTaskRunner

from core.errors import EpisodicError
from core.exit_codes import ExitCode
from core.money import format_minor, parse_amount
from core.playlist import parse_selection
from core.settings import load_settings
from pipeline.engine import RunEngine
from pipeline.generation import generate, prepare
from pipeline.runs import RunOptions
from storage.registry import engine_for
from tasks.generate import PrefectSecretCredentials, prefect_executor


class GenerationFailed(EpisodicError):
    """The run ended with failed items; the message carries the resume command."""


def artifact_key(episode_id: str, what: str) -> str:
    return f"episode-{episode_id.lower()}-{what}"


@flow(
    name="generate-episode",
    task_runner=ThreadPoolTaskRunner(max_workers=8),  # type: ignore[arg-type]
    validate_parameters=True,
)
def generate_episode(
    episode_id: str,
    only: str | None = None,
    concurrency: int = 4,
    max_retries: int = 2,
    max_images: int | None = None,
    max_cost: str | None = None,
    pipeline: str | None = None,
    idempotency_key: str | None = None,
    allow_duplicate: bool = False,
    batch_id: str | None = None,
) -> dict[str, Any]:
    """Generate the images of an existing episode (required id; no default).

    Finished items are skipped, failed ones retried up to max_retries (across runs), and a
    submission whose acceptance is unknown is reconciled, never resubmitted. The same request
    while a run of it is active (same idempotency_key, or same parameters) joins that run:
    the result says ``deduplicated: true``.
    """
    logger = get_run_logger()
    settings = load_settings()
    db = engine_for(settings)
    name = pipeline or settings.pipeline
    prepared = prepare(db, settings, name, episode_id, "generate")
    videos = max(item.index for item in prepared.items)
    options = RunOptions(
        only=parse_selection(only, videos) if only else None,
        concurrency=concurrency,
        max_retries=max_retries,
        max_images=max_images,
        max_cost_minor=parse_amount(max_cost) if max_cost is not None else None,
        lease_s=settings.lease_s,
    )

    def on_start(engine: RunEngine, run_id: str) -> None:
        total = max(1, len(engine.store.run_items(run_id)))
        progress_id: UUID = create_progress_artifact(  # type: ignore[assignment]
            0.0,
            key=artifact_key(episode_id, "progress"),
            description=f"generation run {run_id}",
        )
        done = [0]

        def on_progress(item: object, result: str) -> None:
            done[0] += 1
            update_progress_artifact(progress_id, 100.0 * done[0] / total)

        engine.on_progress = on_progress

    outcome = generate(
        db,
        settings,
        name,
        episode_id,
        options,
        PrefectSecretCredentials(),
        idempotency_key=idempotency_key,
        batch_id=batch_id,
        allow_duplicate=allow_duplicate,
        executor=prefect_executor,
        on_start=on_start,
    )
    if outcome.deduplicated:
        logger.info(
            "deduplicated: run %s was already working on the same request; joined it",
            outcome.run_id,
        )
    if outcome.run_id is None:
        logger.info(outcome.message)
        if outcome.exit_code != ExitCode.OK:
            raise GenerationFailed(outcome.message)
        return outcome.to_dict()
    run_id = outcome.run_id
    counts = outcome.counts
    create_table_artifact(
        key=artifact_key(episode_id, "cost"),
        table=[
            {
                "run": run_id,
                "completed": counts.completed,
                "skipped": outcome.skipped,
                "failed": counts.failed,
                "paid submissions": counts.paid_submissions,
                "cost": format_minor(counts.cost_minor, counts.currency),
            }
        ],
        description=f"cost of generation run {run_id} for {episode_id}",
    )
    logger.info(outcome.message)
    if outcome.exit_code != ExitCode.OK:
        raise GenerationFailed(outcome.message)
    return outcome.to_dict()
