"""`episodic pipelines list|set-timezone`: the settings every process of a pipeline shares."""

from __future__ import annotations

from typing import Annotated

import typer

from cli import context
from cli.options import JsonOption
from cli.output import emit_json, table

app = typer.Typer(
    help="Pipelines and their recorded timezone (the one weeks are computed in).",
    no_args_is_help=True,
)


@app.command("list")
def list_pipelines(as_json: JsonOption = False) -> None:
    """Pipelines with their recorded timezone."""
    from pipeline.pipelines import list_pipelines as listing

    rows = listing(context.engine())
    if as_json:
        emit_json(rows)
        return
    table(
        "pipelines",
        ["pipeline", "timezone", "since"],
        ((r["pipeline"], r["timezone"], r["updated_at"]) for r in rows),
    )


@app.command("set-timezone")
def set_timezone(
    pipeline: Annotated[str, typer.Argument(help="Pipeline name, e.g. weekly.")],
    timezone: Annotated[str, typer.Argument(help="IANA timezone, e.g. Europe/Berlin.")],
    as_json: JsonOption = False,
) -> None:
    """Change the timezone a pipeline's weeks and schedules use (the only way to change it).

    Redeploy afterwards (`episodic serve` or `prefect deploy --all`) so the weekly schedules
    follow, and give workers the same EPISODIC_TIMEZONE or none.
    """
    from pipeline.pipelines import set_timezone as change

    result = change(context.engine(), pipeline, timezone)
    if as_json:
        emit_json(result)
    elif result["previous"] is None:
        typer.echo(f"{result['pipeline']}: new pipeline, timezone {result['timezone']}")
    elif result["previous"] == result["timezone"]:
        typer.echo(f"{result['pipeline']}: already {result['timezone']}")
    else:
        typer.echo(
            f"{result['pipeline']}: {result['previous'] or '(unset)'} → {result['timezone']}; "
            "redeploy so the schedules follow"
        )
