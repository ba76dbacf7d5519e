"""`episodic runs list|show|resume|adopt|cancel`."""

from __future__ import annotations

from typing import Annotated

import typer

from episodic.cli import context
from episodic.cli.options import JsonOption, PipelineOption, StrictInt
from episodic.cli.output import emit_json, error, table

app = typer.Typer(help="Inspect, resume and cancel generation runs.", no_args_is_help=True)
RunArg = Annotated[
    str, typer.Argument(help="Run id (from `episodic runs list`), or its first 4+ characters.")
]


@app.command("list")
def list_runs(
    episode: Annotated[str | None, typer.Option(help="Only runs of this episode.")] = None,
    pipeline: PipelineOption = None,
    as_json: JsonOption = False,
) -> None:
    """List runs, newest first."""
    from episodic.core.ids import EpisodeId
    from episodic.storage.engine import database_label
    from episodic.storage.runs import RunStore

    episode_id = str(EpisodeId.parse(episode)) if episode else None
    store = RunStore(context.engine())
    runs = store.list_runs(context.pipeline_name(pipeline), episode_id)
    if as_json:
        emit_json([{**_run_dict(r), **store.counts(r.run_id).to_dict()} for r in runs])
        return
    if not runs:
        typer.echo(f"no runs (database: {database_label(store.engine)})")
        return
    table(
        None,
        ["run", "episode", "command", "state", "created (UTC)"],
        (
            (r.run_id, r.episode_id, r.command, r.state, r.created_at.strftime("%Y-%m-%d %H:%M:%S"))
            for r in runs
        ),
    )


@app.command("show")
def show_run(run_id: RunArg, as_json: JsonOption = False) -> None:
    """Show a run, its counts, cost and items."""
    from episodic.core.money import format_money
    from episodic.core.states import RunState
    from episodic.storage.runs import RunStore

    run_id = context.resolve_run_id(run_id)
    store = RunStore(context.engine())
    run = store.get_run(run_id)
    counts = store.counts(run_id)
    items = store.run_items(run_id)
    if as_json:
        emit_json(
            {
                **_run_dict(run),
                **counts.to_dict(),
                "items": [
                    {
                        "item_id": i.item_id,
                        "state": i.state,
                        "attempts": i.attempts,
                        "idempotency_key": i.idempotency_key,
                        "error_text": i.error_text,
                    }
                    for i in items
                ],
            }
        )
        return
    typer.echo(
        f"run {run.run_id} ({run.command} {run.episode_id}): {run.state}"
        + (f" ({run.error_text})" if run.error_text else "")
    )
    extras = [
        f"idempotency key {run.idempotency_key}" if run.idempotency_key else "",
        f"batch {run.batch_id}" if run.batch_id else "",
        f"lease until {run.lease_expires_at:%Y-%m-%d %H:%M:%S} UTC"
        if run.state == RunState.RUNNING and run.lease_expires_at
        else "",
    ]
    if any(extras):
        typer.echo("  " + ", ".join(e for e in extras if e))
    typer.echo(
        f"  completed {counts.completed}, failed {counts.failed}, pending {counts.pending}, "
        f"paid submissions {counts.paid_submissions}, cost "
        f"{format_money(counts.cost_micros, counts.currency)}"
    )
    table(
        None,
        ["item", "state", "attempts", "error"],
        ((i.item_id, i.state, i.attempts, i.error_text or "") for i in items),
    )
    if run.state == RunState.PAUSED:
        for line in _collectable(run_id, run.episode_id):
            typer.echo(line)


def _collectable(run_id: str, episode_id: str) -> list[str]:
    """For a paused run: how long each of its accepted jobs stays collectable, where its
    provider documents a retention (`Profile.output_retention_s`), and what to run before."""
    from datetime import timedelta

    from episodic.core.errors import EpisodicError
    from episodic.providers.profiles import configured_profiles
    from episodic.providers.retention import output_retention_s
    from episodic.storage.base import utcnow
    from episodic.storage.provider_outputs import ProviderOutputs

    accepted = ProviderOutputs(context.engine(read_only=True)).accepted_of_run(run_id)
    if not accepted:
        return []
    try:
        profiles = configured_profiles(context.settings())
    except EpisodicError:  # an unreadable providers file: the retention is not known here
        profiles = {}
    now = utcnow()
    lines = []
    for profile_id, remote_ref, made in accepted:
        profile = profiles.get(profile_id)
        keeps = None if profile is None else output_retention_s(profile)
        if profile is None or keeps is None:
            lines.append(f"  accepted job {remote_ref} ({profile_id}): collected by a resume")
            continue
        until = made + timedelta(seconds=keeps)
        when = f"{until:%Y-%m-%d %H:%M:%S} UTC"
        lines.append(
            f"  accepted job {remote_ref} ({profile_id}): its {profile.kind} output is kept "
            f"{keeps // 60} min after the job was made: collectable until about {when}, "
            f"by `episodic runs resume {run_id}`"
            if until > now
            else f"  accepted job {remote_ref} ({profile_id}): its {profile.kind} output was "
            f"kept until about {when}; a resume finds it gone and records it lost (paid), "
            f"bought again by `episodic media restore {episode_id} --buy-again`"
        )
    return lines


@app.command("resume")
def resume(
    run_id: RunArg,
    force_resubmit: Annotated[
        bool,
        typer.Option(help="Resubmit items whose acceptance is unknown (recorded in the ledger)."),
    ] = False,
    max_images: Annotated[
        int | None,
        typer.Option(
            click_type=StrictInt(0),
            help="At most this many paid calls in the run, all its resumes counted.",
        ),
    ] = None,
    max_cost: Annotated[
        str | None,
        typer.Option(help="At most this much spent by the run (spent + in flight + next)."),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Resume a paused or failed run: collect accepted work, retry failed items, never pay
    twice. A run stopped at a cap goes on with a bigger --max-cost / --max-images."""
    from episodic.cli.generate import resume_run

    resume_run(
        run_id,
        force_resubmit=force_resubmit,
        as_json=as_json,
        max_images=max_images,
        max_cost=max_cost,
    )


@app.command("adopt")
def adopt(
    run_id: RunArg,
    item: Annotated[str, typer.Argument(help="Item id (e.g. v01.p1; see `episodic runs show`).")],
    job: Annotated[
        str,
        typer.Option(
            "--job",
            help="The provider's job id you found (a Replicate prediction id, a fal request id).",
        ),
    ],
    as_json: JsonOption = False,
) -> None:
    """Record a job you found at the provider as the item's paid call whose outcome is
    unknown, after verifying it there for free (model, the item's input). Pays nothing;
    `episodic runs resume RUN` then collects it. Refused (exit 2): a job the ledger records
    for another item, or one that is not the item's; exit 1: the provider did not answer."""
    from episodic.pipeline.adopt import adopt_job
    from episodic.providers.profiles import configured_profiles
    from episodic.tasks.credentials import CommandLineCredentials

    run_id = context.resolve_run_id(run_id)
    settings = context.settings()
    adopted = adopt_job(
        context.engine(),
        configured_profiles(settings),
        settings.home_path,
        run_id,
        item,
        job,
        CommandLineCredentials(),
    )
    if as_json:
        emit_json(adopted.to_dict())
        return
    typer.echo(
        f"item {adopted.item_id}: job {adopted.job} adopted ({adopted.verified}; nothing "
        f"paid); collect it with: episodic runs resume {run_id}"
    )


@app.command("cancel")
def cancel(run_id: RunArg, as_json: JsonOption = False) -> None:
    """Cancel a pending, running or paused run; its unstarted items are cancelled too, and
    the jobs the provider accepted for it and nobody collected are cancelled at the provider
    where its API allows (each answer is recorded), except a job whose item another live run
    includes: that run collects it. Cancelling a cancelled run asks again."""
    from episodic.core.exit_codes import ExitCode
    from episodic.core.states import RunState
    from episodic.pipeline.cancel import cancel_run
    from episodic.storage.runs import RunStore
    from episodic.tasks.credentials import CommandLineCredentials

    run_id = context.resolve_run_id(run_id)
    state, jobs = cancel_run(context.engine(), context.settings(), run_id, CommandLineCredentials())
    if as_json:
        run = _run_dict(RunStore(context.engine()).get_run(run_id))
        emit_json({**run, "provider_cancels": [job.to_dict() for job in jobs]})
    else:
        typer.echo(
            f"run {run_id} cancelled" if state == RunState.CANCELLED else f"run {run_id} is {state}"
        )
        for job in jobs:
            typer.echo(f"  job {job.remote_ref} ({job.profile}): {job.answer}")
    missed = [job for job in jobs if job.missed]
    if missed:
        error(
            f"{len(missed)} of {len(jobs)} accepted jobs were not cancelled at the provider "
            f"({missed[0].answer}); run the cancel again once that is fixed"
        )
        raise typer.Exit(int(ExitCode.ERROR))


def _run_dict(run: object) -> dict[str, object]:
    from dataclasses import asdict

    data = asdict(run)  # type: ignore[call-overload]
    return {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in data.items()}
