"""`episodic spend`: the ledger's spend by week, month, episode, profile or pipeline."""

from __future__ import annotations

import csv
import sys
from typing import Annotated, Any

import typer

from episodic.cli import context
from episodic.cli.options import JsonOption
from episodic.cli.output import emit_json, table

CSV_COLUMNS = [
    "row",
    "by",
    "group",
    "pipeline",
    "currency",
    "calls",
    "spent",
    "spent_micros",
    "in_flight_calls",
    "in_flight",
    "in_flight_micros",
]


def spend(
    group_by: Annotated[
        str,
        typer.Option("--group-by", help="Group by week, month, episode, profile or pipeline."),
    ] = "week",
    pipeline: Annotated[
        str | None,
        typer.Option("--pipeline", help="Only this pipeline [default: every pipeline]."),
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(help="From this day on, inclusive (YYYY-MM-DD, the pipeline's timezone)."),
    ] = None,
    until: Annotated[
        str | None,
        typer.Option(help="Up to and including this day (YYYY-MM-DD, the pipeline's timezone)."),
    ] = None,
    as_json: JsonOption = False,
    as_csv: Annotated[bool, typer.Option("--csv", help="Print CSV (a header row).")] = False,
) -> None:
    """What the ledger says was spent: paid calls and their exact cost per group and
    currency (never summed across currencies), and what is in flight (open calls at what
    each was reserved at).

    A paid call is dated by when it was committed, in its pipeline's timezone (the rule the
    period budgets use): weeks are ISO weeks (Monday to Sunday), months calendar months."""
    from episodic.core.errors import InvalidInput
    from episodic.pipeline.spend import check_grouping, check_window, parse_day, spend_report

    if as_json and as_csv:
        raise InvalidInput("give --json or --csv, not both")
    check_grouping(group_by)
    first, last = parse_day(since, "--since"), parse_day(until, "--until")
    check_window(first, last)
    report = spend_report(
        context.engine(read_only=True), by=group_by, pipeline=pipeline, since=first, until=last
    )
    if as_json:
        emit_json(report)
    elif as_csv:
        _write_csv(report)
    else:
        _print_table(report)


def _write_csv(report: dict[str, Any]) -> None:
    writer = csv.DictWriter(sys.stdout, CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in report["groups"]:
        writer.writerow({"row": "group", "by": report["by"], "pipeline": "", **row})
    for total in report["totals"]:
        writer.writerow({"row": "total", "by": report["by"], "group": "", "pipeline": "", **total})


def _print_table(report: dict[str, Any]) -> None:
    from episodic.core.money import format_money

    by = report["by"]
    window = ", ".join(
        part
        for part in (
            f"since {report['since']}" if report["since"] else "",
            f"until {report['until']} (inclusive)" if report["until"] else "",
        )
        if part
    )
    zones = ", ".join(f"{name} ({zone})" for name, zone in report["pipelines"].items())
    title = f"spend by {by}" + (f", {window}" if window else "") + (f": {zones}" if zones else "")
    columns = [by, *(["pipeline"] if by == "episode" else []), "paid calls", "spent"]
    columns += ["in flight", "reserved"]

    def cells(group: str, row: dict[str, Any]) -> list[Any]:
        out: list[Any] = [group, *([row.get("pipeline", "")] if by == "episode" else [])]
        out += [row["calls"], format_money(row["spent_micros"], row["currency"])]
        out += [row["in_flight_calls"], format_money(row["in_flight_micros"], row["currency"])]
        return out

    rows = [cells(row["group"], row) for row in report["groups"]]
    rows += [cells("total", total) for total in report["totals"]]
    if not report["groups"]:
        typer.echo(f"{title}: no paid calls")
        return
    table(title, columns, rows)
