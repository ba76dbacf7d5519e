"""`episodic replay`: run a pipeline's scheduled slot now, as its scheduled run would."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Annotated
from zoneinfo import ZoneInfo

import typer

from episodic.cli import context
from episodic.cli.options import JsonOption, PipelineOption
from episodic.cli.output import emit_json


def replay(
    slot: Annotated[
        str,
        typer.Option(
            "--slot",
            help="The slot's scheduled start with its UTC offset, e.g. "
            "2026-08-06T09:00:00+02:00 (or ...T07:00:00Z).",
        ),
    ],
    pipeline: PipelineOption = None,
    playlist: Annotated[
        Path | None,
        typer.Option(
            help="Playlist to plan from when the episode has no plan yet (here only; "
            "default: the weekly deployment's, examples/playlist.yaml)."
        ),
    ] = None,
    deployment: Annotated[
        str | None,
        typer.Option(
            help="Hand the replay to this deployment's workers instead (e.g. "
            "weekly-episode/weekly): it waits for approval in the UI as the scheduled run "
            "would. Needs PREFECT_API_URL."
        ),
    ] = None,
    generate: Annotated[
        bool, typer.Option("--generate/--no-generate", help="Generate (paid) after planning.")
    ] = True,
    off_schedule: Annotated[
        bool,
        typer.Option(
            "--off-schedule",
            help="Replay a moment that is not one of the schedule's slots (a slot of a "
            "schedule changed since, say); without it such a moment is refused.",
        ),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Run the weekly chain of one slot now, with its scheduled run's identity.

    The slot's episode is the one its scheduled run owns (allocated if none ran yet): a
    repeat, or a replay of a slot the scheduler already ran, returns the same episode and
    pays nothing twice. Here: allocate, plan, generate, then approve with `episodic
    approve`. With --deployment: a flow run of that deployment, run by its workers.
    """
    from episodic.core.keys import parse_slot

    moment = parse_slot(slot)  # bad input: refused before anything else
    name = context.pipeline_name(pipeline)
    import episodic.tasks  # noqa: F401  (Prefect defaults before Prefect is imported)

    if deployment is not None:
        if playlist is not None or not generate:
            from episodic.core.errors import InvalidInput

            raise InvalidInput("--playlist and --no-generate are the deployment's parameters")
        _replay_on_deployment(slot, moment, name, deployment, off_schedule, as_json)
        return
    _replay_here(slot, moment, name, playlist, generate, off_schedule, as_json)


def _replay_on_deployment(
    slot: str, moment: datetime, name: str, deployment: str, off_schedule: bool, as_json: bool
) -> None:
    """The replay as a flow run of `deployment`, run by its workers (they allocate the slot's
    episode and wait for approval in the UI)."""
    _needs_server()
    from episodic.flows.replay import deployment_crons, replay_on_deployment

    if not off_schedule:
        _check_on_schedule(slot, moment, deployment_crons(deployment), deployment)
    result = replay_on_deployment(name, moment, deployment)
    if as_json:
        emit_json(result.to_dict())
        return
    typer.echo(
        f"slot {result.allocation_key}: flow run {result.flow_run_name} "
        f"({result.flow_run_id}) of {deployment}: {result.state}; its workers allocate "
        "the slot's episode and wait for approval in the UI"
    )


def _replay_here(
    slot: str,
    moment: datetime,
    name: str,
    playlist: Path | None,
    generate: bool,
    off_schedule: bool,
    as_json: bool,
) -> None:
    """The replay in this process: allocate, plan (from `playlist`, else the weekly
    deployment's when the episode has no plan), generate; the next step is printed."""
    from episodic.core.states import EpisodeState
    from episodic.deployments.spec import DEFAULT_PLAYLIST, WEEKLY_SLOTS
    from episodic.flows.replay import replay_here

    if not off_schedule:
        from episodic.pipeline.pipelines import pipeline_timezone
        from episodic.storage.registry import engine_for

        zone = pipeline_timezone(engine_for(context.settings()), context.settings(), name)
        crons = [(cron, str(zone)) for _, cron in WEEKLY_SLOTS]
        _check_on_schedule(slot, moment, crons, "the weekly schedule")

    if playlist is not None and not playlist.is_file():
        from episodic.core.errors import InvalidInput

        raise InvalidInput(f"--playlist {playlist} not found")
    default = Path(DEFAULT_PLAYLIST)  # relative: the project folder's, as on a worker
    chosen = playlist if playlist is not None else (default if default.is_file() else None)
    result = replay_here(context.settings(), name, moment, chosen, generate=generate)
    if as_json:
        emit_json(result.to_dict())
        return
    typer.echo(f"slot {result.allocation_key}: episode {result.episode_id}, {result.state}")
    if result.state == EpisodeState.GENERATED:
        typer.echo(f"next: episodic approve {result.episode_id} --by NAME [--reject --reason R]")
    elif result.state == EpisodeState.ALLOCATED and chosen is None:
        typer.echo(f"next: episodic replay --slot {slot} --playlist FILE (no plan yet)")


def _check_on_schedule(
    given: str, moment: datetime, crons: list[tuple[str, str]], where: str
) -> None:
    """Refuse (`InvalidInput`, exit 2) a moment that no cron of ``crons`` (expression,
    timezone) fires at: a forgotten or wrong UTC offset would otherwise allocate, and pay
    for, an episode of a slot that does not exist. No cron schedule at all: nothing to hold
    the moment against."""
    from cronsim import CronSim

    from episodic.core.errors import InvalidInput

    if not crons:
        return
    for expression, zone in crons:
        local = moment.astimezone(ZoneInfo(zone))
        if next(CronSim(expression, local - timedelta(seconds=1))) == local:
            return
    slots = ", ".join(f"{expression} ({zone})" for expression, zone in crons)
    raise InvalidInput(
        f"slot {given} is not a slot of {where} ({slots}); check its UTC offset, or pass "
        "--off-schedule to replay it anyway"
    )


def _needs_server() -> None:
    import os

    from episodic.core.errors import InvalidInput

    if not os.environ.get("PREFECT_API_URL"):
        from prefect.settings import get_current_settings

        if not get_current_settings().api.url:
            raise InvalidInput(
                "replay --deployment needs a Prefect server: set PREFECT_API_URL "
                "(e.g. http://127.0.0.1:4200/api)"
            )
