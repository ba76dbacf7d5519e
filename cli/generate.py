"""`episodic plan`, `episodic generate`, `episodic retry`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from cli import context
from cli.options import JsonOption, PipelineOption
from cli.output import emit_json

if TYPE_CHECKING:
    from pipeline.generation import Prepared
    from pipeline.runs import RunOptions, RunOutcome

EpisodeArg = Annotated[str, typer.Argument(help="Episode id, e.g. 2026-W32-0 (must exist).")]


def plan(
    episode_id: EpisodeArg,
    playlist: Annotated[Path, typer.Option(help="Playlist YAML (see docs/playlist.md).")],
    pipeline: PipelineOption = None,
    as_json: JsonOption = False,
) -> None:
    """Record what EPISODE_ID will generate. Spends nothing."""
    from pipeline.generation import record_plan

    result = record_plan(context.engine(), context.pipeline_name(pipeline), episode_id, playlist)
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
    only: Annotated[
        str | None, typer.Option(help="Only these videos (1-based), e.g. 3,7-9.")
    ] = None,
    concurrency: Annotated[
        int, typer.Option(min=1, max=64, help="Parallel paid calls (capped by the provider).")
    ] = 4,
    max_retries: Annotated[
        int, typer.Option(min=0, max=20, help="Retries of a failed item, counted across runs.")
    ] = 2,
    max_images: Annotated[
        int | None, typer.Option(min=0, help="Refuse a plan with more new paid calls.")
    ] = None,
    max_cost: Annotated[
        str | None, typer.Option(help="Refuse a plan estimated above this amount, e.g. 5.00.")
    ] = None,
    show_plan: Annotated[
        bool, typer.Option("--plan", help="Only show the plan: new calls, skipped, cost.")
    ] = False,
    resume: Annotated[
        str | None, typer.Option(help="Resume this run instead (alias of `runs resume`).")
    ] = None,
    force_resubmit: Annotated[
        bool, typer.Option(help="Resubmit items whose acceptance is unknown (recorded).")
    ] = False,
    pipeline: PipelineOption = None,
    as_json: JsonOption = False,
) -> None:
    """Generate EPISODE_ID's images: skip finished items, retry failed ones, never pay twice."""
    from core.money import parse_amount
    from core.playlist import parse_selection
    from pipeline.generation import prepare
    from pipeline.runs import RunOptions, check_budget, create_run
    from pipeline.runs import plan as make_plan
    from storage.runs import RunStore

    if resume is not None:
        resume_run(resume, force_resubmit=force_resubmit, as_json=as_json)
        return
    engine = context.engine()
    prepared = prepare(
        engine, context.settings(), context.pipeline_name(pipeline), episode_id, "generate"
    )
    videos = max(item.index for item in prepared.items)
    options = RunOptions(
        only=parse_selection(only, videos) if only else None,
        concurrency=concurrency,
        max_retries=max_retries,
        max_images=max_images,
        max_cost_minor=parse_amount(max_cost) if max_cost is not None else None,
        lease_s=context.settings().lease_s,
        force_resubmit=force_resubmit,
    )
    store = RunStore(engine)
    report = make_plan(store, prepared.gate, prepared.items, options, prepared.profile)
    if show_plan:
        check_budget(report, options)
        _print_plan(report.to_dict(), as_json)
        return
    run_id = create_run(store, prepared.gate, prepared.items, report, options, prepared.profile)
    _execute(prepared, run_id, options, report.skipped, as_json)


def retry(
    episode_id: EpisodeArg,
    force_resubmit: Annotated[
        bool, typer.Option(help="Resubmit items whose acceptance is unknown.")
    ] = False,
    pipeline: PipelineOption = None,
    as_json: JsonOption = False,
) -> None:
    """Retry the failed items of EPISODE_ID's latest generation run."""
    from core.ids import EpisodeId
    from pipeline.gate import open_gate
    from storage.runs import RunStore

    gate = open_gate(
        context.engine(), context.pipeline_name(pipeline), str(EpisodeId.parse(episode_id)), "retry"
    )
    run_id = RunStore(context.engine()).latest_run(gate.episode_pk, "generate")
    if run_id is None:
        from core.errors import CommandNotAllowed

        raise CommandNotAllowed(f"episode {gate.episode_id} has no generation run to retry")
    resume_run(run_id, force_resubmit=force_resubmit, as_json=as_json)


def resume_run(run_id: str, *, force_resubmit: bool, as_json: bool) -> None:
    from dataclasses import replace

    from pipeline.generation import prepare
    from pipeline.runs import RunOptions, prepare_resume
    from storage.runs import RunStore

    engine = context.engine()
    store = RunStore(engine)
    run = store.get_run(run_id)
    prepared = prepare(engine, context.settings(), run.pipeline, run.episode_id, "resume")
    if run.state == "completed":
        outcome_json = {"run_id": run_id, "state": "completed", "message": "nothing to resume"}
        emit_json(outcome_json) if as_json else typer.echo(f"run {run_id} already completed")
        return
    prepare_resume(store, run_id)
    options = replace(RunOptions.from_params(run.params), force_resubmit=force_resubmit)
    _execute(prepared, run_id, options, 0, as_json)


def _execute(
    prepared: Prepared, run_id: str, options: RunOptions, skipped: int, as_json: bool
) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from core.money import format_minor
    from pipeline.gate import EnvironmentCredentials
    from pipeline.generation import run_engine
    from storage.runs import RunStore

    engine = run_engine(context.engine(), context.settings(), prepared, EnvironmentCredentials())
    total = len(RunStore(context.engine()).run_items(run_id))
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        transient=True,
        disable=as_json,
    ) as progress:
        task = progress.add_task(f"generating {prepared.gate.episode_id}", total=total)
        engine.on_progress = lambda item, result: progress.advance(task)
        outcome: RunOutcome = engine.execute(run_id, options, skipped)
    if as_json:
        emit_json(outcome.to_dict())
    else:
        counts = outcome.counts
        typer.echo(
            f"{outcome.message}\n  completed {counts.completed}, skipped {outcome.skipped}, "
            f"failed {counts.failed}, new paid submissions {counts.paid_submissions}, "
            f"cost {format_minor(counts.cost_minor, counts.currency)}"
        )
    raise typer.Exit(int(outcome.exit_code))


def _print_plan(report: dict[str, object], as_json: bool) -> None:
    from core.money import format_minor

    if as_json:
        emit_json(report)
        return
    typer.echo(
        f"plan: {report['new_calls']} new paid calls, {report['skipped']} skipped (done), "
        f"{report['to_collect']} to collect, {report['to_reconcile']} to reconcile, "
        f"{report['busy']} busy, {report['exhausted']} out of retries; estimated cost "
        f"{format_minor(int(str(report['estimated_cost_minor'])), str(report['currency']))}"
    )
