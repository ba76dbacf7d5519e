"""`episodic db upgrade|current|installation`."""

from __future__ import annotations

from typing import Annotated

import typer

from episodic.cli import context
from episodic.cli.options import JsonOption
from episodic.cli.output import emit_json

app = typer.Typer(help="Manage the database schema.", no_args_is_help=True)


@app.command("upgrade")
def upgrade(as_json: JsonOption = False) -> None:
    """Apply Alembic migrations up to the newest revision (safe to run repeatedly)."""
    from episodic.storage.engine import make_engine
    from episodic.storage.installation import find
    from episodic.storage.schema import upgrade as run_upgrade

    settings = context.settings()
    engine = make_engine(settings.url)
    # read under the migration's lock: of several upgrades at once, one says it upgraded
    before, after = run_upgrade(engine)
    if as_json:
        emit_json(
            {"from": before, "to": after, "changed": before != after, "installation": find(engine)}
        )
    elif before == after:
        typer.echo(f"schema already at {after}")
    else:
        typer.echo(f"schema upgraded from {before or 'empty'} to {after}")


@app.command("current")
def current(as_json: JsonOption = False) -> None:
    """Print the schema revision of the database."""
    from episodic.storage.engine import make_engine
    from episodic.storage.installation import find
    from episodic.storage.schema import HEAD_REVISION, current_revision

    engine = make_engine(context.settings().url)
    revision = current_revision(engine)
    installation = find(engine) if revision is not None else None
    if as_json:
        emit_json({"revision": revision, "head": HEAD_REVISION, "installation": installation})
    else:
        shown = f", installation {installation}" if installation else ""
        typer.echo(f"{revision or 'empty'} (head {HEAD_REVISION}){shown}")


RenewOption = Annotated[
    bool,
    typer.Option(
        "--renew",
        help="Give this database a new installation id (after copying it from another "
        "installation); references already recorded keep theirs.",
    ),
]


@app.command("installation")
def installation(renew: RenewOption = False, as_json: JsonOption = False) -> None:
    """Print this database's installation id, the prefix of every reference it sends to a
    provider (docs/providers.md); --renew makes a new one."""
    from episodic.storage.installation import installation_id
    from episodic.storage.installation import renew as renew_id

    engine = context.engine()  # at head (the embedded default upgrades itself), else exit 1
    if renew:
        old, new, disowned = renew_id(engine)
        if as_json:
            emit_json({"installation": new, "previous": old, "renewed": True, "disowned": disowned})
        else:
            typer.echo(f"installation {new} (was {old})")
            if disowned:
                typer.echo(
                    f"{disowned} open provider jobs of installation {old} closed here "
                    "(never collected or cancelled from this database; its next run buys "
                    "its own)"
                )
        return
    current_id = installation_id(engine)
    if as_json:
        emit_json({"installation": current_id, "renewed": False})
    else:
        typer.echo(current_id)
