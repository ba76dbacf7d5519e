"""`episodic pipelines list|set-timezone|set-budget`: what every process of a pipeline shares."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from episodic.cli import context
from episodic.cli.options import JsonOption
from episodic.cli.output import emit_json, table

app = typer.Typer(
    help="Pipelines and their recorded timezone (the one weeks are computed in).",
    no_args_is_help=True,
)


@app.command("list")
def list_pipelines(as_json: JsonOption = False) -> None:
    """Pipelines with their recorded timezone."""
    from episodic.pipeline.pipelines import list_pipelines as listing

    rows = listing(context.engine())
    if as_json:
        emit_json(rows)
        return

    def budget(row: dict[str, Any], period: str) -> str:
        found = row["budgets"].get(period)
        return "" if found is None else str(found["shown"])

    table(
        "pipelines",
        ["pipeline", "timezone", "since", "weekly budget", "monthly budget"],
        (
            (r["pipeline"], r["timezone"], r["updated_at"], budget(r, "week"), budget(r, "month"))
            for r in rows
        ),
    )


@app.command("set-budget")
def set_budget(
    pipeline: Annotated[str, typer.Argument(help="Pipeline name, e.g. weekly.")],
    amount: Annotated[
        str | None, typer.Argument(help="The budget, a decimal such as 20.00 (not with --clear).")
    ] = None,
    per: Annotated[str, typer.Option("--per", help="The period: week or month.")] = "week",
    currency: Annotated[str, typer.Option(help="The budget's currency code.")] = "USD",
    clear: Annotated[bool, typer.Option("--clear", help="Remove the period's budget.")] = False,
    new: Annotated[
        bool, typer.Option("--new", help="The pipeline has not run yet (no episode, no row).")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Set the pipeline's weekly or monthly budget: no item is claimed whose price would take
    the period's spend (paid + in flight, every run and machine) over it (ISO weeks and
    calendar months in the pipeline's timezone). A budget below what the period has already
    spent is refused."""
    from episodic.core.errors import InvalidInput
    from episodic.pipeline.pipelines import set_budget as record

    if clear == (amount is not None):
        raise InvalidInput("give an AMOUNT, or --clear to remove the budget (not both)")
    result = record(context.engine(), context.settings(), pipeline, per, amount, currency, new=new)
    if as_json:
        emit_json(result)
    elif result["amount"] is None:
        typer.echo(f"{result['pipeline']}: no {result['period']}ly budget")
    else:
        typer.echo(
            f"{result['pipeline']}: budget {result['amount']} {result['currency']} per "
            f"{result['period']} ({result['timezone']}); spent this {result['period']}: "
            f"{result['spent']} {result['currency']}, in flight {result['in_flight']}"
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
    from episodic.pipeline.pipelines import set_timezone as change

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
