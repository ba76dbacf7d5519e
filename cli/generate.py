"""`episodic plan`, `episodic generate`, `episodic retry`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from cli import context
from cli.options import (
    AllowDuplicateOption,
    BatchIdOption,
    IdempotencyKeyOption,
    JsonOption,
    PipelineOption,
    StrictInt,
)
from cli.output import emit_json

if TYPE_CHECKING:
    from pipeline.generation import OnStart
    from pipeline.outcomes import RunOutcome
    from pipeline.runner import Runner

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
        int,
        typer.Option(
            click_type=StrictInt(1, 64), help="Parallel paid calls (capped by the provider)."
        ),
    ] = 4,
    max_retries: Annotated[
        int,
        typer.Option(
            click_type=StrictInt(0, 20), help="Retries of a failed item, counted across runs."
        ),
    ] = 2,
    collect_timeout: Annotated[
        int,
        typer.Option(
            click_type=StrictInt(1, 86400),
            help="Seconds to keep collecting an accepted job before leaving it to the next "
            "run (free).",
        ),
    ] = 600,
    max_images: Annotated[
        int | None,
        typer.Option(click_type=StrictInt(0), help="Refuse a plan with more new paid calls."),
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
    hero_candidates: Annotated[
        int | None,
        typer.Option(
            click_type=StrictInt(1, 50),
            help="Hero runs at N paid candidates each (recorded in the plan; growing 4 to 6 "
            "pays for 2). Without hero runs in the playlist: every one-image video.",
        ),
    ] = None,
    idempotency_key: IdempotencyKeyOption = None,
    allow_duplicate: AllowDuplicateOption = False,
    batch_id: BatchIdOption = None,
    pipeline: PipelineOption = None,
    as_json: JsonOption = False,
) -> None:
    """Generate EPISODE_ID's images: skip finished items, retry failed ones, never pay twice.

    An identical request while a run of it is active joins that run (deduplicated).
    """
    from core.dedup import check_dedup_options
    from core.planning import check_budget
    from pipeline.admission import options_from_request
    from pipeline.admission import plan as make_plan
    from pipeline.gate import EnvironmentCredentials
    from pipeline.generation import generate as generate_run
    from pipeline.generation import prepare
    from storage.plans import PlanStore

    check_dedup_options(idempotency_key, batch_id, allow_duplicate)
    if resume is not None and hero_candidates is not None:
        from core.errors import InvalidInput

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
    name = context.pipeline_name(pipeline)
    prepared = prepare(
        engine, settings, name, episode_id, "generate", hero_candidates=hero_candidates
    )
    options = options_from_request(
        settings,
        prepared.items,
        only=only,
        concurrency=concurrency,
        max_retries=max_retries,
        max_images=max_images,
        max_cost=max_cost,
        force_resubmit=force_resubmit,
        collect_timeout_s=collect_timeout,
    )
    if show_plan:
        report = make_plan(
            PlanStore(engine), prepared.gate, prepared.items, options, prepared.profile
        )
        check_budget(report, options)
        _print_plan(report.to_dict(), as_json)
        return
    with _progress(as_json) as on_start:
        outcome = generate_run(
            engine,
            settings,
            name,
            episode_id,
            options,
            EnvironmentCredentials(),
            idempotency_key=idempotency_key,
            batch_id=batch_id,
            allow_duplicate=allow_duplicate,
            on_start=on_start,
            hero_candidates=hero_candidates,
        )
    _report(outcome, as_json)


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
    from pipeline.gate import EnvironmentCredentials
    from pipeline.generation import retry as retry_run

    with _progress(as_json) as on_start:
        outcome = retry_run(
            context.engine(),
            context.settings(),
            context.pipeline_name(pipeline),
            episode_id,
            EnvironmentCredentials(),
            force_resubmit=force_resubmit,
            on_start=on_start,
        )
    _report(outcome, as_json)


def resume_run(
    run_id: str,
    *,
    force_resubmit: bool,
    as_json: bool,
    episode_id: str | None = None,
    pipeline: str | None = None,
) -> None:
    """Resume `run_id`; with `episode_id`/`pipeline` (`generate E --resume RUN`), only a
    run of that episode."""
    from core.ids import parse_run_id
    from pipeline.gate import EnvironmentCredentials
    from pipeline.generation import resume

    run_id = parse_run_id(run_id)
    with _progress(as_json) as on_start:
        outcome = resume(
            context.engine(),
            context.settings(),
            run_id,
            EnvironmentCredentials(),
            force_resubmit=force_resubmit,
            on_start=on_start,
            episode_id=episode_id,
            pipeline=pipeline,
        )
    _report(outcome, as_json)


@contextmanager
def _progress(as_json: bool) -> Iterator[OnStart]:
    """A progress bar over the run's items, shown once the run is known (a refused request
    prints nothing but its one-line error)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    shown: list[Progress] = []

    def on_start(engine: Runner, run_id: str) -> None:
        from cli.app import on_signal

        def interrupted() -> None:  # also when the KeyboardInterrupt itself is swallowed
            engine.interrupted.set()
            engine.stop.set()

        on_signal(interrupted)
        if as_json:
            return
        progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            transient=True,
        )
        progress.start()
        shown.append(progress)
        working = f"generating {engine.gate.episode_id}"
        task = progress.add_task(working, total=len(engine.store.run_items(run_id)))
        engine.on_progress = lambda item, result: progress.advance(task)
        engine.on_wait = lambda text: progress.update(task, description=text or working)

    try:
        yield on_start
    finally:
        for progress in shown:
            progress.stop()


def _report(outcome: RunOutcome, as_json: bool) -> None:
    from cli.app import mark_reported
    from core.money import format_minor

    mark_reported()
    if as_json:
        emit_json(outcome.to_dict())
    else:
        counts = outcome.counts
        joined = (
            " (deduplicated: joined the run already working on this request; the figures "
            "below are that run's totals, not this process's)"
            if outcome.deduplicated
            else ""
        )
        typer.echo(
            # The run's figures, whichever process paid (a resume of a run a killed process
            # started shows that process's submissions too: "new" misled a fresh tester).
            f"{outcome.message}{joined}\n  completed {counts.completed}, skipped "
            f"{outcome.skipped}, failed {counts.failed}; the run's paid submissions "
            f"{counts.paid_submissions}, cost {format_minor(counts.cost_minor, counts.currency)}"
            " (every process's that worked on it)"
        )
    raise typer.Exit(int(outcome.exit_code))


def _print_plan(report: dict[str, object], as_json: bool) -> None:
    from core.money import format_minor

    if as_json:
        emit_json(report)
        return
    hero = int(str(report.get("hero_calls", 0)))
    typer.echo(
        f"plan: {report['new_calls']} new paid calls"
        + (f" ({hero} of them hero candidates)" if hero else "")
        + f", {report['skipped']} skipped (done), "
        f"{report['to_collect']} to collect, {report['to_reconcile']} to reconcile, "
        f"{report['busy']} busy, {report['exhausted']} out of retries; estimated cost "
        f"{format_minor(int(str(report['estimated_cost_minor'])), str(report['currency']))}"
    )
