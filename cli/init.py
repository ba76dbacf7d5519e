"""`episodic init` (the starter files) and `episodic schema` (their JSON Schemas)."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from episodic.cli import context
from episodic.cli.options import JsonOption
from episodic.cli.output import emit_json


def init(
    playlist: Annotated[
        Path | None,
        typer.Option(
            "--playlist",
            help="Where the playlist skeleton goes [default: playlist.yaml in the project "
            "folder, else the working directory].",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Write a commented providers file (Replicate and fal profiles with their published
    prices) where the settings read it (EPISODIC_PROVIDERS_FILE, default
    $EPISODIC_HOME/providers.yaml; in a team's repository, providers.yaml there), a playlist
    skeleton, and, in a team's repository (the project folder, else the working directory;
    not a checkout of episodic, which has its own), a prefect.yaml of episodic's
    deployments, run from the installed package, on that playlist, and .gitignore and
    .dockerignore entries for the state folder (.episodic/). An existing file is never
    overwritten: it is kept, and said so (exit 0); an ignore file lacking the entry gets it
    added at its end. Next: `episodic providers check PROFILE`
    (docs/providers.md, From zero to a first paid run)."""
    from episodic.core.home import (
        checked_text,
        installed_project,
        mark_state_folder,
        project_folder,
    )
    from episodic.core.output_files import RecordPaths
    from episodic.pipeline.starter import write_starter_files

    settings = context.settings()
    if playlist is not None:
        checked_text("--playlist", str(playlist))  # no control characters in a name
        playlist = playlist.expanduser()  # `~/x.yaml` is the home folder's, as in a shell
    # a team's repository gets the prefect.yaml of episodic's deployments; a checkout of
    # episodic has its own
    repository = project_folder() or Path.cwd()
    team = installed_project(repository / "core" / "home.py") is None
    providers = settings.providers_path
    if team and settings.providers_file is None:  # the repository keeps its providers file
        providers = repository / "providers.yaml"
    # every file init writes is checked against the record before any is written: the
    # providers file goes where the settings read it (EPISODIC_PROVIDERS_FILE names any
    # path), the state folder included, but never over the ledger, its -wal/-shm/-journal
    # (SQLite would take a YAML -journal for a hot journal) or into the media store
    named = " (EPISODIC_PROVIDERS_FILE)" if settings.providers_file is not None else ""
    RecordPaths.of(settings, state_folder=False, providers_file=False).refuse(
        providers, f"providers file {providers}{named}"
    )
    if playlist is None:  # the default place: the state folder is no harm, the rest is
        playlist = (project_folder() or Path.cwd()) / "playlist.yaml"
        RecordPaths.of(settings, state_folder=False).refuse(playlist, f"playlist {playlist}")
    else:  # a user-named file never goes over (or into) the record
        RecordPaths.of(settings).refuse(playlist, f"--playlist {playlist}")
    prefect = None
    if team:
        prefect = repository / "prefect.yaml"
        # a repository is never the state folder: refused there, as anything of the record
        RecordPaths.of(settings).refuse(prefect, f"prefect.yaml {prefect}")
        for name in (".gitignore", ".dockerignore"):  # appended to: never a part of the record
            RecordPaths.of(settings).refuse(repository / name, f"{name} {repository / name}")
    if providers.parent == settings.home_path:
        mark_state_folder(settings.home_path)
    files = write_starter_files(providers, playlist.absolute(), prefect)
    if as_json:
        emit_json({"files": [file.to_dict() for file in files]})
        return
    for file in files:
        said = "wrote" if file.written else "kept (it exists; not overwritten)"
        if file.added:
            said = "added .episodic/ (the state folder) to"
        elif not file.written and file.what in ("gitignore", "dockerignore"):
            said = "kept (it already ignores .episodic/)"
        typer.echo(f"{file.what}: {said} {file.path}")
    if prefect is not None and settings.providers_file is None:
        typer.echo(
            f"providers: every command reads it with EPISODIC_PROVIDERS_FILE={providers} "
            "(set it in this shell, on the deploying machine and on every worker, naming "
            "their copy)"
        )
    if prefect is not None:
        inside = providers.absolute().is_relative_to(repository.absolute())
        where = "the providers file in it" if inside else f"its copy of {providers}"
        typer.echo(
            f"deploy: from {repository}, `episodic prefect setup --work-pool episodic` then "
            "`prefect deploy --all`; each worker sets EPISODIC_PROJECT_DIR to its copy of this "
            f"folder and EPISODIC_PROVIDERS_FILE to {where} (docs/production.md)"
        )
    typer.echo(
        "next: set REPLICATE_API_TOKEN (https://replicate.com/account/api-tokens) or FAL_KEY "
        "(https://fal.ai/dashboard/keys), then `episodic providers check "
        "replicate-flux-schnell`"
    )


class SchemaKind(StrEnum):
    playlist = "playlist"
    providers = "providers"


def schema(
    kind: Annotated[
        SchemaKind, typer.Argument(help="Which file: playlist or providers.", case_sensitive=True)
    ],
) -> None:
    """Print the JSON Schema (draft 2020-12) of a playlist or a providers file, for editors
    to validate it as it is written (e.g. `episodic schema providers >
    providers.schema.json`, then `# yaml-language-server: $schema=providers.schema.json` at
    the top of the file). Unknown fields are flagged; `episodic providers check` and
    `episodic plan` check the rest."""
    from episodic.pipeline.schemas import json_schema

    typer.echo(json.dumps(json_schema(kind.value), indent=2))
