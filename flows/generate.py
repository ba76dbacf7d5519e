"""`generate_episode`: a paid generation run from Prefect (deployment, UI, or a parent flow).

The same runner as `episodic generate`; each item runs as a cached `generate_item` task.
Cancelling the flow run (or the weekly run it runs in) stops buying and settles what was
bought (`flows.cancellation`): Prefect delivers the cancel as SIGTERM, raised in the flow as
a termination signal; the runner pauses the run (in-flight items end "interrupted", their
task runs Cancelled), then the run is cancelled and its accepted, uncollected jobs are
cancelled at the provider where its API allows, each answer recorded; the `on_cancellation`
hook settles again after the process is gone. A SIGTERM that is not a cancel only pauses the
run: a later run collects its accepted jobs. Its artifacts describe the episode (cumulative
paid calls and cost from the ledger, committed spend, progress of the plan), one card each
per flow run, not the last run.
"""

from __future__ import annotations

from contextlib import suppress
from functools import partial
from typing import Annotated, Any

from prefect import flow
from prefect.exceptions import TerminationSignal
from prefect.logging import get_run_logger
from pydantic import Field
from sqlalchemy import Engine

from episodic.core.errors import EpisodicError
from episodic.core.exit_codes import ExitCode
from episodic.core.hints import surface
from episodic.core.planning import (
    COLLECT_TIMEOUT_RANGE,
    CONCURRENCY_RANGE,
    HERO_CANDIDATES_RANGE,
    MAX_IMAGES_RANGE,
    MAX_RETRIES_RANGE,
    GenerateRequest,
)
from episodic.core.records import ItemResult
from episodic.core.settings import load_settings
from episodic.flows.artifacts import EpisodeProgress, publish_spend
from episodic.flows.cancellation import link_flow_run, settle_hook, settle_in_flow
from episodic.flows.params import (
    AmountParam,
    EpisodeIdParam,
    Flag,
    KeyParam,
    PipelineParam,
    SelectionParam,
    episode_run_name,
    whole,
)
from episodic.pipeline.generation import generate_requested, open_request
from episodic.pipeline.outcomes import RunOutcome
from episodic.pipeline.runner import Runner
from episodic.storage.registry import engine_for
from episodic.tasks.credentials import PrefectSecretCredentials
from episodic.tasks.prefect_executor import prefect_executor
from episodic.tasks.results import result_storage
from episodic.tasks.task_runner import configured_task_runner


class GenerationFailed(EpisodicError):
    """The run ended with failed items; the message says how to finish it."""


@flow(
    name="generate-episode",
    task_runner=configured_task_runner(),
    validate_parameters=True,
    flow_run_name=episode_run_name("generate"),
    on_cancellation=[settle_hook],
)
def generate_episode(
    episode_id: EpisodeIdParam,
    only: SelectionParam = None,
    concurrency: Annotated[int, whole(CONCURRENCY_RANGE)] = 4,
    max_retries: Annotated[int, whole(MAX_RETRIES_RANGE)] = 2,
    max_images: Annotated[int, whole(MAX_IMAGES_RANGE)] | None = None,
    max_cost: AmountParam = None,
    pipeline: PipelineParam = None,
    idempotency_key: KeyParam = None,
    allow_duplicate: Flag = False,
    batch_id: Annotated[str, Field(min_length=1, max_length=64)] | None = None,
    hero_candidates: Annotated[int, whole(HERO_CANDIDATES_RANGE)] | None = None,
    collect_timeout: Annotated[int, whole(COLLECT_TIMEOUT_RANGE)] = 600,
    force_resubmit: Flag = False,
) -> dict[str, Any]:
    """Generate the images of an existing, planned episode (paid; never pays twice).

    Finished items are skipped, failed ones retried up to max_retries (across runs), and a
    submission whose acceptance is unknown is reconciled, never resubmitted. The same request
    while a run of it is active joins that run: the result says ``deduplicated: true``.

    Args:
        episode_id: the episode to generate, e.g. 2026-W32-1 (required; it must exist and
            have a plan).
        only: a selection of videos: ids or positions, e.g. "v03,v05" or "1,3-4" (default: all).
        concurrency: items in flight at once in this run (the provider limit still applies).
        max_retries: paid attempts allowed per failed item after the first, across runs.
        max_images: refuse before spending if more than this many images would be paid for.
        max_cost: refuse before spending if the paid images would cost more (e.g. "2.50",
            in the provider's currency); default: EPISODIC_MAX_RUN_COST.
        pipeline: pipeline name; default: EPISODIC_PIPELINE.
        idempotency_key: the same key again joins (or returns) the run it started; reused
            with other parameters it is refused.
        allow_duplicate: start a new run even if the same request is running.
        batch_id: a caller's batch id: runs of one batch are never joined with others.
        hero_candidates: run every hero run of the plan at this many paid candidates (1-50;
            a plan without hero runs: every one-image video); recorded in the plan, so
            asking for 6 after 4 pays for 2. Refused for an approved episode.
        collect_timeout: seconds an accepted job is collected before its item is left for
            the next run to collect, at no cost (1-86400).
        force_resubmit: abandon a paid call whose acceptance stayed unknown and pay for it
            again (a person's decision: the provider may have made the first job).
    """
    with surface("prefect"):
        request = GenerateRequest(
            episode_id,
            only=only,
            concurrency=concurrency,
            max_retries=max_retries,
            max_images=max_images,
            max_cost=max_cost,
            hero_candidates=hero_candidates,
            idempotency_key=idempotency_key,
            batch_id=batch_id,
            allow_duplicate=allow_duplicate,
            collect_timeout_s=collect_timeout,
            force_resubmit=force_resubmit,
        )
        return _generate(request, pipeline)


def _generate(request: GenerateRequest, pipeline: str | None) -> dict[str, Any]:
    logger = get_run_logger()
    settings = load_settings()
    db = engine_for(settings)
    name = pipeline or settings.pipeline
    episode_id = request.episode_id
    requested = open_request(db, settings, name, request)
    started = _Started(db, name, episode_id, logger)
    report: dict[str, Any] | None = None
    try:
        outcome = generate_requested(
            db,
            settings,
            requested,
            PrefectSecretCredentials(),
            executor=partial(
                prefect_executor,
                storage=result_storage(settings),
                pipeline=name,
                episode_id=requested.prepared.gate.episode_id,
                options=requested.options,
            ),
            on_start=started,
        )
    except TerminationSignal:  # a cancel of this flow run (or its parent), or a shutdown
        started.close()
        if started.runs:
            settle_in_flow(db, settings, *started.runs[-1])
        raise
    finally:  # the episode's artifacts, also when the run was cancelled or failed
        started.close()  # first: a late update never follows the final figure
        with suppress(Exception):
            report = publish_spend(db, name, episode_id)
    _log_outcome(logger, outcome, episode_id, report)
    if outcome.exit_code != ExitCode.OK:
        raise GenerationFailed(outcome.message)
    return outcome.to_dict()


class _Started:
    """The runs this flow run started (`on_start`): each linked to the flow run's chain
    (`link_flow_run`: (run id, chain) in `runs`) and publishing its episode's progress as
    its items complete, until `close`."""

    def __init__(self, db: Engine, pipeline: str, episode_id: str, logger: Any) -> None:
        self.db, self.pipeline, self.episode_id, self.logger = db, pipeline, episode_id, logger
        self.runs: list[tuple[str, list[str]]] = []
        self.publishers: list[EpisodeProgress] = []

    def __call__(self, runner: Runner, run_id: str) -> None:
        self.runs.append((run_id, link_flow_run(self.db, run_id)))
        progress = EpisodeProgress(self.db, self.pipeline, self.episode_id)
        self.publishers.append(progress)

        def on_progress(item: object, result: str) -> None:
            if result == ItemResult.COMPLETED:
                progress.completed_one()

        runner.on_progress = on_progress
        runner.on_wait = lambda text: self.logger.info(text) if text else None

    def close(self) -> None:
        for publisher in self.publishers:
            publisher.close()


def _log_outcome(
    logger: Any, outcome: RunOutcome, episode_id: str, report: dict[str, Any] | None
) -> None:
    """The run's outcome in the flow run's log, with the episode's figures (`report`)."""
    if outcome.deduplicated:
        logger.info(
            "deduplicated: run %s was already working on the same request; joined it",
            outcome.run_id,
        )
    logger.info(outcome.message)
    if report is not None:
        logger.info(
            "episode %s: %d of %d images done, %d paid calls, %s",
            episode_id,
            report["completed"],
            report["planned"],
            report["paid_submissions"],
            report["cost"],
        )
