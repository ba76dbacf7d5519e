"""`episodic check`."""

from __future__ import annotations

from typing import Annotated

import typer

from cli import context
from cli.options import JsonOption, PipelineOption
from cli.output import emit_json


def check(
    episode_id: Annotated[str | None, typer.Argument(help="One episode, e.g. 2026-W32-0.")] = None,
    check_all: Annotated[
        bool, typer.Option("--all", help="Every episode of the pipeline.")
    ] = False,
    pipeline: PipelineOption = None,
    as_json: JsonOption = False,
) -> None:
    """Audit episodes read-only (ids, files, ledger, states); exit 1 on findings."""
    from core.errors import InvalidInput
    from pipeline.check import check_episodes
    from pipeline.runs import dedup_policy

    if (episode_id is None) == (not check_all):
        raise InvalidInput("give an EPISODE_ID or --all")
    findings = check_episodes(
        context.engine(read_only=True),
        context.pipeline_name(pipeline),
        episode_id,
        dedup_policy(context.settings()),
    )
    if as_json:
        emit_json({"clean": not findings, "findings": [f.to_dict() for f in findings]})
    elif not findings:
        typer.echo("clean")
    else:
        for finding in findings:
            typer.echo(f"{finding.episode_id}: {finding.check}: {finding.detail}")
    raise typer.Exit(1 if findings else 0)
