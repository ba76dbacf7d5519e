"""`episodic allocate`."""

from __future__ import annotations

from typing import Annotated

import typer

from episodic.cli import context
from episodic.cli.options import JsonOption, PipelineOption
from episodic.cli.output import emit_json


def allocate(
    key: Annotated[
        str, typer.Option("--key", help="Allocation key: the invocation's stable identity.")
    ],
    week: Annotated[str | None, typer.Option(help="ISO week, e.g. 2026-W32.")] = None,
    at: Annotated[
        str | None,
        typer.Option(
            help="A moment with UTC offset, e.g. 2026-08-07T09:00:00+02:00; its ISO "
            "week in the pipeline's recorded timezone is used."
        ),
    ] = None,
    pipeline: PipelineOption = None,
    as_json: JsonOption = False,
) -> None:
    """Allocate the episode owned by KEY (or find it again). Exit 3 if KEY owns another week."""
    from datetime import datetime

    from episodic.core.errors import InvalidInput
    from episodic.core.ids import WeekId
    from episodic.core.keys import validate_key
    from episodic.core.schedule_slots import allocation_week, slot_week
    from episodic.pipeline.allocation import allocate as allocate_episode
    from episodic.pipeline.pipelines import pipeline_timezone

    if (week is None) == (at is None):
        raise InvalidInput("give exactly one of --week or --at")
    moment = None
    if at is not None:
        try:
            moment = datetime.fromisoformat(at)
        except ValueError:
            raise InvalidInput(f"--at {at!r} is not an ISO-8601 date-time") from None
        if moment.tzinfo is None:
            raise InvalidInput(f"--at {at!r} has no UTC offset (e.g. +02:00 or Z)")
    validate_key(key)
    stated = WeekId.parse(week) if week is not None else None
    name = context.pipeline_name(pipeline)
    tz = pipeline_timezone(context.engine(), context.settings(), name)
    if moment is not None:
        stated = slot_week(moment, tz)
    week_id = allocation_week(key, tz, stated=stated, key_name="--key").week
    allocation = allocate_episode(context.engine(), name, week_id, key)
    if as_json:
        emit_json(allocation.to_dict())
    else:
        typer.echo(
            f"{allocation.episode.episode_id} ({'new' if allocation.created else 'existing'})"
        )
