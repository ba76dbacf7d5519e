"""`episodic db upgrade|current`."""

from __future__ import annotations

import typer

from cli import context
from cli.options import JsonOption
from cli.output import emit_json

app = typer.Typer(help="Manage the database schema.", no_args_is_help=True)


@app.command("upgrade")
def upgrade(as_json: JsonOption = False) -> None:
    """Apply Alembic migrations up to the newest revision (safe to run repeatedly)."""
    from storage.engine import make_engine
    from storage.schema import current_revision
    from storage.schema import upgrade as run_upgrade

    settings = context.settings()
    engine = make_engine(settings.url)
    before = current_revision(engine)
    run_upgrade(engine)
    after = current_revision(engine)
    if as_json:
        emit_json({"from": before, "to": after, "changed": before != after})
    elif before == after:
        typer.echo(f"schema already at {after}")
    else:
        typer.echo(f"schema upgraded from {before or 'empty'} to {after}")


@app.command("current")
def current(as_json: JsonOption = False) -> None:
    """Print the schema revision of the database."""
    from storage.engine import make_engine
    from storage.schema import HEAD_REVISION, current_revision

    revision = current_revision(make_engine(context.settings().url))
    if as_json:
        emit_json({"revision": revision, "head": HEAD_REVISION})
    else:
        typer.echo(f"{revision or 'empty'} (head {HEAD_REVISION})")
