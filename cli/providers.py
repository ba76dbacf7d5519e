"""`episodic providers list|check`: provider profiles, what each promises, and a credential
check that spends nothing."""

from __future__ import annotations

from typing import Annotated

import typer

from cli import context
from cli.options import JsonOption
from cli.output import emit_json, table

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
    from pipeline.provider_check import capability_row
    from providers.profiles import load_profiles

    profiles = load_profiles(context.settings().providers_path)
    rows = [capability_row(profiles[name]).to_dict() for name in sorted(profiles)]
    if as_json:
        emit_json(rows)
        return
    table(None, _COLUMNS, (_cells(row) for row in rows))


@app.command("check")
def check(profile: ProfileArg, as_json: JsonOption = False) -> None:
    """Validate a profile and verify its credential without spending (a free call where the
    provider's API has one; otherwise it says it cannot check without spending). The
    credential comes from its environment variable, or its Prefect Secret block through the
    configured Prefect API. Exit 0 verified or not checkable, 2 invalid profile or refused
    credential, 1 no answer."""
    from core.exit_codes import ExitCode
    from pipeline.gate import EnvironmentCredentials
    from pipeline.provider_check import capability_row, check_profile
    from providers.profiles import get_profile, load_profiles

    settings = context.settings()
    chosen = get_profile(load_profiles(settings.providers_path), profile)
    row = capability_row(chosen).to_dict()
    if chosen.credential_secret_block:  # read from the Prefect API configured here
        from tasks.credentials import PrefectSecretCredentials

        result = check_profile(chosen, PrefectSecretCredentials(), settings.home_path)
    else:
        result = check_profile(chosen, EnvironmentCredentials(), settings.home_path)
    if as_json:
        emit_json({**row, "check": {"ok": result.ok, "message": result.message}})
    else:
        table(None, _COLUMNS, [_cells(row)])
        typer.echo(f"check: {result.message}")
    if result.ok is False:
        refused = "refused" in result.message
        raise typer.Exit(int(ExitCode.REFUSED if refused else ExitCode.ERROR))
