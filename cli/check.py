"""`episodic check`."""

from __future__ import annotations

from typing import Annotated

import typer

from episodic.cli import context
from episodic.cli.options import JsonOption, PipelineOption
from episodic.cli.output import emit_json


def check(
    episode_id: Annotated[str | None, typer.Argument(help="One episode, e.g. 2026-W32-0.")] = None,
    check_all: Annotated[
        bool, typer.Option("--all", help="Every episode of the pipeline.")
    ] = False,
    pipeline: PipelineOption = None,
    as_json: JsonOption = False,
) -> None:
    """Audit episodes read-only (ids, files, ledger, states); exit 8 on findings.

    Media are read from the media store (EPISODIC_MEDIA_URL): each completed image, cover
    and manifest must be there, hold its recorded size and sha256, and decode.

    Money: every cost entry's amount is recomputed from its basis, quantity and unit
    price, and `episodic spend`'s totals (by every grouping) are held against the ledger's
    own sums of the pipeline; a disagreement is a finding.

    Warnings (a slot that several deployments asked for; images still in local files from
    before the media store) are listed but do not change the exit code."""
    from episodic.core.errors import InvalidInput
    from episodic.core.exit_codes import ExitCode
    from episodic.pipeline.admission import dedup_policy
    from episodic.pipeline.check import Finding, check_episodes, legacy_warnings
    from episodic.pipeline.check_spend import verify_spend
    from episodic.pipeline.slot_warnings import schedule_warnings

    if (episode_id is None) == (not check_all):
        raise InvalidInput("give an EPISODE_ID or --all")
    engine = context.engine(read_only=True)
    name = context.pipeline_name(pipeline)
    store = context.media_store(engine, read_only=True)
    findings = check_episodes(
        engine, name, episode_id, dedup_policy(context.settings()), store=store
    )
    from episodic.storage.store_identity import marker_missing

    if marker_missing(engine, store):  # read on at the recorded address; nothing may write
        findings.insert(
            0,
            Finding(
                f"media store {store.describe()}",
                "marker",
                "its episodic-store.json is missing: every command that stores media is "
                "refused until `episodic media restore-marker` checks a sample of its images "
                "and writes it again",
            ),
        )
    spend = verify_spend(engine, name)
    findings += [Finding(f"pipeline {name}", "spend", problem) for problem in spend.problems]
    warnings = schedule_warnings(engine, name, episode_id)
    warnings += legacy_warnings(engine, name, episode_id)
    if as_json:
        emit_json(
            {
                "clean": not findings,
                "findings": [f.to_dict() for f in findings],
                "warnings": [w.to_dict() for w in warnings],
                "spend": spend.to_dict(),
            }
        )
    else:
        for warning in warnings:
            typer.echo(f"{warning.episode_id}: warning: {warning.check}: {warning.detail}")
        if not findings:
            typer.echo("clean")
        for finding in findings:
            typer.echo(f"{finding.episode_id}: {finding.check}: {finding.detail}")
    raise typer.Exit(int(ExitCode.CHECK_FINDINGS if findings else ExitCode.OK))
