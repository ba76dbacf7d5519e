"""`episodic migrate-legacy`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from episodic.cli import context
from episodic.cli.options import JsonOption, PipelineOption
from episodic.cli.output import emit_json, table


def migrate_legacy(
    path: Annotated[
        Path, typer.Argument(help="Folder of legacy week folders (YYYY-Www/state.json).")
    ],
    apply: Annotated[
        bool, typer.Option("--apply", help="Write (default: dry run, writes nothing).")
    ] = False,
    pipeline: PipelineOption = None,
    as_json: JsonOption = False,
) -> None:
    """Import legacy weekly episodes as versioned ids; idempotent; never builds a provider."""
    from episodic.pipeline.legacy import migrate

    report = migrate(
        context.engine(),
        context.settings(),
        context.pipeline_name(pipeline),
        path,
        apply=apply,  # the media store is opened once there, when a week is imported
    )
    if as_json:
        emit_json({"applied": apply, "episodes": report})
        return
    table(
        "legacy migration" + ("" if apply else " (dry run: nothing written; --apply to write)"),
        ["legacy", "episode", "images", "cost (minor)", "approval", "action"],
        (
            (
                r["legacy_id"],
                r["episode_id"],
                r["images"],
                r["cost_micros"],
                r["approval"],
                r["action"],
            )
            for r in report
        ),
    )
