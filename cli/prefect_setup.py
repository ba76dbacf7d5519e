"""`episodic prefect setup`: what the flows need on the Prefect server, idempotently."""

from __future__ import annotations

from typing import Annotated

import typer

from episodic.cli.options import JsonOption, PipelineOption
from episodic.cli.output import emit_json

app = typer.Typer(help="The Prefect side of the project.", no_args_is_help=True)


@app.command("setup")
def setup(
    pipeline: PipelineOption = None,
    work_pool: Annotated[
        str | None,
        typer.Option(help="Also create this process work pool (for `prefect deploy`)."),
    ] = None,
    notify: Annotated[
        str | None,
        typer.Option(
            "--notify",
            metavar="BLOCK",
            help="Create or update two automations sending through this notification block "
            "(its name, or TYPE-SLUG/NAME; save it on the server first): an approval form "
            "that waited --approval-wait, and a flow run that failed or crashed.",
        ),
    ] = None,
    approval_wait: Annotated[
        str | None,
        typer.Option(
            "--approval-wait",
            metavar="DURATION",
            help="With --notify (refused without it): how long an approval waits before the "
            "notification, e.g. 4h, 30m, 2d (10s to 90d) [default: 4h].",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Create or update every limit and pool the flows need; safe to run repeatedly.

    Records the pipeline's timezone on first use (EPISODIC_TIMEZONE, else UTC) and refuses
    when EPISODIC_TIMEZONE disagrees with the recorded one; lists each provider profile's
    limit (held by the database's claims); with a remote media store (EPISODIC_MEDIA_URL
    s3://, gs://, az://) and no EPISODIC_RESULT_STORAGE, saves a RemoteFileSystem block on the
    same URL under prefect-results/ for the flows' results; checks the result storage loads;
    warns when more than one deployment of the weekly flow schedules the pipeline; with
    --notify, creates or updates the automations that notify an approval waiting and a failed
    flow run. Uses PREFECT_API_URL.
    """
    import re

    from episodic.core.errors import InvalidInput

    if work_pool is not None and not re.fullmatch(
        r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}", work_pool, re.ASCII
    ):
        raise InvalidInput(
            f"--work-pool {work_pool!r}: use 1-100 of A-Z a-z 0-9 _ . - starting with a "
            "letter or digit"
        )
    if approval_wait is not None and notify is None:
        raise InvalidInput(
            "--approval-wait only sets when --notify BLOCK notifies a waiting approval: "
            "add --notify, or drop --approval-wait; nothing was done"
        )
    wait_s = _approval_wait_s(approval_wait if approval_wait is not None else "4h")
    if notify is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_./-]{0,199}", notify):
        raise InvalidInput(f"--notify {notify!r}: a block name (A-Z a-z 0-9 _ . - /)")
    import episodic.tasks  # noqa: F401  (Prefect defaults before Prefect is imported)
    from episodic.cli import context
    from episodic.deployments.setup import prefect_setup

    result = prefect_setup(
        context.pipeline_name(pipeline),
        work_pool=work_pool,
        settings=context.settings(),
        notify=notify,
        approval_wait_s=wait_s,
    )
    if as_json:
        emit_json(result)
        return
    typer.echo(f"pipeline {result['pipeline']}: timezone {result['timezone']}")
    for limit in result["limits"]:  # held by the database's claims, not a Prefect limit
        typer.echo(f"provider {limit['profile']}: at most {limit['limit']} jobs at once")
    if result["work_pool"]:
        typer.echo(f"work pool {result['work_pool']}: ready")
    typer.echo(f"result storage: {result['result_storage']}")
    for automation in result["notifications"]:
        typer.echo(f"automation {automation['name']!r}: {automation['changed']}")
    for warning in result["warnings"]:
        typer.echo(f"warning: {warning}", err=True)


def _approval_wait_s(text: str) -> int:
    """--approval-wait as seconds (no Prefect import: a bad value is refused at once)."""
    import re

    from episodic.core.errors import InvalidInput

    found = re.fullmatch(r"(\d{1,6})([smhd])", text.strip(), re.ASCII)
    seconds = (
        int(found.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[found.group(2)]
        if found
        else 0
    )
    if not 10 <= seconds <= 90 * 86400:
        raise InvalidInput(
            f"--approval-wait {text!r}: a duration from 10s to 90d, e.g. 4h, 30m, 2d"
        )
    return seconds
