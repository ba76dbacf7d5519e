"""`episodic providers list|check`: provider profiles, what each promises, and a credential
check that spends nothing."""

from __future__ import annotations

from typing import Annotated

import typer

from episodic.cli import context
from episodic.cli.options import JsonOption
from episodic.cli.output import emit_json, table

app = typer.Typer(
    help="Provider profiles: capabilities and credential checks.", no_args_is_help=True
)
ProfileArg = Annotated[
    str, typer.Argument(help="Provider profile id (see `episodic providers list`).")
]
_COLUMNS = [
    "profile",
    "kind",
    "idempotent create",
    "lookup",
    "cancel",
    "cost",
    "on ambiguous reply",
]


def _cells(row: dict[str, object]) -> tuple[str, ...]:
    return (
        str(row["profile"]),
        str(row["kind"]),
        "yes" if row["idempotent_create"] else "no",
        str(row["lookup"]),
        str(row["cancel"]),
        str(row["cost"]),
        str(row["on_ambiguous_reply"]),
    )


@app.command("list")
def list_profiles(as_json: JsonOption = False) -> None:
    """Every provider profile (built in and from EPISODIC_PROVIDERS_FILE) and its capabilities."""
    from episodic.pipeline.provider_check import capability_row
    from episodic.providers.profiles import configured_profiles

    profiles = configured_profiles(context.settings())
    rows = [capability_row(profiles[name]).to_dict() for name in sorted(profiles)]
    if as_json:
        emit_json(rows)
        return
    table(None, _COLUMNS, (_cells(row) for row in rows))


@app.command("check")
def check(profile: ProfileArg, as_json: JsonOption = False) -> None:
    """Validate a profile and verify what can be verified without spending: the credential
    (Replicate, http), the model and its pinned version, and every configured input name
    against the model's input schema (Replicate, fal); fal's key cannot be checked without
    spending. The credential comes from its environment variable, or its Prefect Secret
    block through PREFECT_API_URL. Exit 0 verified (or not checkable), 2 invalid profile,
    refused credential, unknown model or unknown input, 1 no answer."""
    from episodic.core.exit_codes import ExitCode
    from episodic.pipeline.provider_check import capability_row, check_profile
    from episodic.providers.profiles import configured_profiles, get_profile
    from episodic.tasks.credentials import CommandLineCredentials

    settings = context.settings()
    chosen = get_profile(configured_profiles(context.settings()), profile)
    row = capability_row(chosen).to_dict()
    result = check_profile(chosen, CommandLineCredentials(), settings.home_path)
    if as_json:
        emit_json({**row, "check": {"ok": result.ok, "message": result.message}})
    else:
        table(None, _COLUMNS, [_cells(row)])
        typer.echo(f"check: {result.message}")
    if result.ok is False:
        raise typer.Exit(int(ExitCode.REFUSED if result.refused else ExitCode.ERROR))
