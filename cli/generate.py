"""`episodic plan`, `episodic generate`, `episodic retry`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from episodic.cli import context
from episodic.cli.options import (
    AllowDuplicateOption,
    BatchIdOption,
    IdempotencyKeyOption,
    JsonOption,
    PipelineOption,
    StrictInt,
)
from episodic.cli.output import emit_json
from episodic.cli.run_output import report_outcome, run_progress
from episodic.core.hints import counted
from episodic.core.planning import (
    COLLECT_TIMEOUT_RANGE,
    CONCURRENCY_RANGE,
    HERO_CANDIDATES_RANGE,
    MAX_IMAGES_RANGE,
    MAX_RETRIES_RANGE,
)

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from episodic.pipeline.generation import Requested

EpisodeArg = Annotated[str, typer.Argument(help="Episode id, e.g. 2026-W32-0 (must exist).")]


# generate's options
OnlyOption = Annotated[
    str | None,
    typer.Option(help="Only these videos: ids or 1-based positions, e.g. v03,v05 or 3,7-9."),
]
ConcurrencyOption = Annotated[
    int,
    typer.Option(
        click_type=StrictInt(*CONCURRENCY_RANGE),
        help="Parallel paid calls (capped by the provider).",
    ),
]
MaxRetriesOption = Annotated[
    int,
    typer.Option(
        click_type=StrictInt(*MAX_RETRIES_RANGE),
        help="Retries of a failed item, counted across runs.",
    ),
]
CollectTimeoutOption = Annotated[
    int,
    typer.Option(
        click_type=StrictInt(*COLLECT_TIMEOUT_RANGE),
        help="Seconds to keep collecting an accepted job before leaving it to the next run (free).",
    ),
]
MaxImagesOption = Annotated[
    int | None,
    typer.Option(
        click_type=StrictInt(*MAX_IMAGES_RANGE), help="Refuse a plan with more new paid calls."
    ),
]
MaxCostOption = Annotated[
    str | None, typer.Option(help="Refuse a plan estimated above this amount, e.g. 5.00.")
]
ShowPlanOption = Annotated[
    bool, typer.Option("--plan", help="Only show the plan: new calls, skipped, cost.")
]
ResumeOption = Annotated[
    str | None, typer.Option(help="Resume this run instead (alias of `runs resume`).")
]
ForceResubmitOption = Annotated[
    bool, typer.Option(help="Resubmit items whose acceptance is unknown (recorded).")
]
HeroCandidatesOption = Annotated[
    int | None,
    typer.Option(
        click_type=StrictInt(*HERO_CANDIDATES_RANGE),
        help="Hero runs at N paid candidates each (recorded in the plan; growing 4 to 6 "
        "pays for 2). Without hero runs in the playlist: every one-image video.",
    ),
]


def plan(
    episode_id: EpisodeArg,
    playlist: Annotated[Path, typer.Option(help="Playlist YAML (see docs/playlist.md).")],
    pipeline: PipelineOption = None,
    as_json: JsonOption = False,
) -> None:
    """Record what EPISODE_ID will generate. Spends nothing."""
    from episodic.pipeline.episode_plan import record_plan

    result = record_plan(
        context.engine(),
        context.pipeline_name(pipeline),
        episode_id,
        playlist,
        providers_path=context.settings().providers_path,
    )
    if as_json:
        emit_json(result)
        return
    verb = "recorded" if result["recorded"] else "unchanged"
    typer.echo(
        f"{result['episode_id']}: plan {verb}: {result['videos']} videos, "
        f"{result['images']} images, template {result['template']}, "
        f"provider {result['provider_profile']}"
    )


def generate(
    episode_id: EpisodeArg,
    only: OnlyOption = None,
    concurrency: ConcurrencyOption = 4,
    max_retries: MaxRetriesOption = 2,
    collect_timeout: CollectTimeoutOption = 600,
    max_images: MaxImagesOption = None,
    max_cost: MaxCostOption = None,
    show_plan: ShowPlanOption = False,
    resume: ResumeOption = None,
    force_resubmit: ForceResubmitOption = False,
    hero_candidates: HeroCandidatesOption = None,
    idempotency_key: IdempotencyKeyOption = None,
    allow_duplicate: AllowDuplicateOption = False,
    batch_id: BatchIdOption = None,
    pipeline: PipelineOption = None,
    as_json: JsonOption = False,
) -> None:
    """Generate EPISODE_ID's images: skip finished items, retry failed ones, never pay twice.

    An identical request while a run of it is active joins that run (deduplicated).
    """
    from episodic.core.planning import GenerateRequest
    from episodic.pipeline.generation import generate_requested, open_request
    from episodic.tasks.credentials import CommandLineCredentials

    request = GenerateRequest(
        episode_id,
        only=only,
        concurrency=concurrency,
        max_retries=max_retries,
        max_images=max_images,
        max_cost=max_cost,
        force_resubmit=force_resubmit,
        collect_timeout_s=collect_timeout,
        hero_candidates=hero_candidates,
        idempotency_key=idempotency_key,
        batch_id=batch_id,
        allow_duplicate=allow_duplicate,
    )
    if resume is not None and hero_candidates is not None:
        from episodic.core.errors import InvalidInput

        raise InvalidInput(
            "--resume continues a run as it was admitted; --hero-candidates changes the plan "
            "(use one of them)"
        )
    if resume is not None:
        resume_run(
            resume,
            force_resubmit=force_resubmit,
            as_json=as_json,
            episode_id=episode_id,
            pipeline=context.pipeline_name(pipeline),
        )
        return
    engine = context.engine()
    settings = context.settings()
    requested = open_request(engine, settings, context.pipeline_name(pipeline), request)
    if show_plan:
        _show_plan(engine, requested, as_json)
        return
    with run_progress(as_json) as on_start:
        outcome = generate_requested(
            engine, settings, requested, CommandLineCredentials(), on_start=on_start
        )
    report_outcome(outcome, as_json)


def retry(
    episode_id: EpisodeArg,
    force_resubmit: Annotated[
        bool, typer.Option(help="Resubmit items whose acceptance is unknown.")
    ] = False,
    pipeline: PipelineOption = None,
    as_json: JsonOption = False,
) -> None:
    """Retry the failed items of EPISODE_ID's latest generation run (or join it if it is
    still running; a run whose process died is taken over; a cancelled run's request is
    asked again)."""
    from episodic.pipeline.generation import retry as retry_run
    from episodic.tasks.credentials import CommandLineCredentials

    with run_progress(as_json) as on_start:
        outcome = retry_run(
            context.engine(),
            context.settings(),
            context.pipeline_name(pipeline),
            episode_id,
            CommandLineCredentials(),
            force_resubmit=force_resubmit,
            on_start=on_start,
        )
    report_outcome(outcome, as_json)


def resume_run(
    run_id: str,
    *,
    force_resubmit: bool,
    as_json: bool,
    episode_id: str | None = None,
    pipeline: str | None = None,
    max_images: int | None = None,
    max_cost: str | None = None,
) -> None:
    """Resume `run_id`; with `episode_id`/`pipeline` (`generate E --resume RUN`), only a
    run of that episode; `max_images`/`max_cost`: the run's limits from now on."""
    from episodic.core.money import parse_money
    from episodic.pipeline.generation import resume
    from episodic.tasks.credentials import CommandLineCredentials

    run_id = context.resolve_run_id(run_id)
    max_cost_micros = parse_money(max_cost) if max_cost is not None else None  # exit 2
    with run_progress(as_json) as on_start:
        outcome = resume(
            context.engine(),
            context.settings(),
            run_id,
            CommandLineCredentials(),
            force_resubmit=force_resubmit,
            on_start=on_start,
            episode_id=episode_id,
            pipeline=pipeline,
            max_images=max_images,
            max_cost_micros=max_cost_micros,
        )
    report_outcome(outcome, as_json)


def _show_plan(engine: Engine, requested: Requested, as_json: bool) -> None:
    """`generate --plan`: what the run would do and cost, refused past the budget; spends
    nothing."""
    from episodic.core.planning import check_budget
    from episodic.pipeline.admission import check_period_budgets
    from episodic.pipeline.admission import plan as make_plan
    from episodic.storage.plans import PlanStore

    prepared, options = requested.prepared, requested.options
    report = make_plan(PlanStore(engine), prepared.gate, prepared.items, options, prepared.profile)
    check_budget(report, options)
    check_period_budgets(engine, prepared.gate.pipeline, report)
    shown = report.to_dict()
    pricing = prepared.profile.pricing
    shown |= {  # what the estimate stands on: the basis, the unit price and the bound
        "estimate": prepared.profile.estimate_text(report.new_calls),
        "basis": pricing.basis,
        "unit_price_micros": pricing.unit_micros,
        "estimate_quantity": pricing.estimate_quantity,
    }
    _print_plan(shown, as_json)


def _print_plan(report: dict[str, object], as_json: bool) -> None:

    if as_json:
        emit_json(report)
        return
    hero = int(str(report.get("hero_calls", 0)))
    typer.echo(
        f"plan: {counted(int(str(report['new_calls'])), 'new paid call')}"
        + (f" ({hero} of them hero candidates)" if hero else "")
        + f", {report['skipped']} skipped (done), "
        f"{report['to_collect']} to collect, {report['to_reconcile']} to reconcile, "
        f"{report['busy']} busy, {report['exhausted']} out of retries; {report['estimate']}"
    )
