"""`episodic state show|remove`: where this installation's state lives, and removing it."""

from __future__ import annotations

from typing import Annotated

import typer

from episodic.cli import context
from episodic.cli.options import JsonOption
from episodic.cli.output import emit_json

app = typer.Typer(
    help="The state folder: the embedded ledger, paid images, Prefect home, results.",
    no_args_is_help=True,
)


@app.command("show")
def show(as_json: JsonOption = False) -> None:
    """Print where the state folder and the ledger are, and what the ledger holds (paid
    calls, money). Creates nothing."""
    from episodic.pipeline.state_folder import inspect_state

    folder = inspect_state(context.settings())
    if as_json:
        emit_json(folder.to_dict())
        return
    project = str(folder.project) if folder.project is not None else "(none: not a checkout)"
    typer.echo(f"project: {project}")
    typer.echo(f"state folder: {folder.home}" + ("" if folder.exists else " (not created yet)"))
    typer.echo(f"ledger: {folder.database}")
    if folder.sqlite_file is not None:
        typer.echo(f"holds: {folder.holdings()}")


YesOption = Annotated[
    bool, typer.Option("--yes", help="Remove the state folder (refused without it).")
]
IncludingPaidOption = Annotated[
    bool,
    typer.Option(
        "--including-paid",
        help="Also when its ledger records paid calls (with --yes): forgets what was paid "
        "for, so a later run pays again.",
    ),
]


@app.command("remove")
def remove(
    yes: YesOption = False, including_paid: IncludingPaidOption = False, as_json: JsonOption = False
) -> None:
    """Remove the state folder (EPISODIC_HOME): the embedded SQLite ledger, paid images,
    providers.yaml, Prefect's home and results.

    Refused (exit 2, nothing removed) without --yes; while the ledger records paid calls,
    unless --including-paid too; always for a PostgreSQL ledger (a server database is never
    dropped, and the local folder holds the images it records as paid); and for a SQLite
    ledger outside the state folder. `make clean-state` runs it.
    """
    from episodic.pipeline.state_folder import remove_state

    folder = remove_state(context.settings(), yes=yes, including_paid=including_paid)
    if as_json:
        emit_json({**folder.to_dict(), "removed": folder.exists})
    elif not folder.exists:
        typer.echo(f"nothing to remove: {folder.home} does not exist")
    else:
        typer.echo(f"removed {folder.home} (its ledger held {folder.holdings()})")
