"""`episodic sweep` and `episodic dispatch`."""

from __future__ import annotations

import os
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated

import typer

from episodic.cli import context
from episodic.cli.options import (
    AllowDuplicateOption,
    IdempotencyKeyOption,
    JsonOption,
    PipelineOption,
)
from episodic.cli.output import emit_json, table

if TYPE_CHECKING:
    from episodic.core.settings import Settings


class DispatchCommand(StrEnum):
    generate = "generate"
    approve = "approve"
    assemble = "assemble"


def sweep(
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Only report what would be moved.")
    ] = False,
    prefect: Annotated[
        bool | None,
        typer.Option(
            "--prefect/--no-prefect",
            help="Also cancel this project's flow runs stuck in Scheduled/Late/Pending past "
            "the pending TTL, and crash its flow and task runs left Running by a dead "
            "process [default: when PREFECT_API_URL is set].",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Reap stuck work: expired run and item leases → failed (resumable), runs never started
    within EPISODIC_PENDING_TTL_S → cancelled, orphaned items of cancelled runs → cancelled;
    with Prefect, stuck flow runs → cancelled and flow/task runs a dead process left Running
    → crashed.

    Never touches completed work or a submission; safe to run at any time, also twice at once.
    """
    from episodic.pipeline.sweep import BUCKET_MEANING
    from episodic.pipeline.sweep import sweep as run_sweep

    settings = context.settings()
    report = run_sweep(context.engine(), settings, dry_run=dry_run)
    buckets: dict[str, list[object]] = dict(report.moved)
    meaning = dict(BUCKET_MEANING)
    skipped: dict[str, str] = {}
    use_prefect = prefect if prefect is not None else bool(os.environ.get("PREFECT_API_URL"))
    if use_prefect:
        for bucket, (ids, what) in _prefect_buckets(settings, dry_run).items():
            buckets[bucket] = ids
            meaning[bucket] = what
    else:
        why = "no PREFECT_API_URL (pass --prefect to use a profile's)"
        skipped["stuck_flow_runs"] = why
        skipped["crashed_flow_runs"] = why
    if as_json:
        emit_json(
            {
                "dry_run": dry_run,
                "at": report.at.isoformat(),
                "buckets": {k: {"count": len(v), "ids": v} for k, v in buckets.items()},
                "skipped": skipped,
            }
        )
        return
    verb = "would move" if dry_run else "moved"
    total = sum(len(v) for v in buckets.values())
    typer.echo(f"sweep{' (dry run)' if dry_run else ''}: {verb} {total}")
    rows: list[tuple[str, str, str]] = [(k, str(len(v)), meaning[k]) for k, v in buckets.items()]
    rows += [(k, "-", f"skipped: {why}") for k, why in skipped.items()]
    table(None, ["bucket", verb, "what"], rows)


def _prefect_buckets(settings: Settings, dry_run: bool) -> dict[str, tuple[list[object], str]]:
    """The Prefect side of the sweep, bucket -> (ids moved, what it means): this project's
    flow runs stuck past the pending TTL (cancelled), and flow and task runs a dead process
    left Running (crashed)."""
    import episodic.tasks  # noqa: F401  (Prefect defaults before Prefect is imported)
    from episodic.flows.maintenance import (
        GHOST_BUCKET,
        GHOST_MEANING,
        PREFECT_BUCKET,
        PREFECT_MEANING,
        cancel_stuck_flow_runs,
        crash_ghost_runs,
    )
    from episodic.pipeline.admission import dedup_policy

    stuck: list[object] = list(cancel_stuck_flow_runs(settings.pending_ttl_s, dry_run=dry_run))
    ghosts: list[object] = list(
        crash_ghost_runs(context.engine(), dedup_policy(settings).fallback_lease_s, dry_run=dry_run)
    )
    return {PREFECT_BUCKET: (stuck, PREFECT_MEANING), GHOST_BUCKET: (ghosts, GHOST_MEANING)}


def dispatch(
    command: Annotated[DispatchCommand, typer.Argument(help="Which deployment to start.")],
    episode_id: Annotated[str, typer.Argument(help="Episode id, e.g. 2026-W32-0 (must exist).")],
    idempotency_key: IdempotencyKeyOption = None,
    allow_duplicate: AllowDuplicateOption = False,
    pipeline: PipelineOption = None,
    as_json: JsonOption = False,
) -> None:
    """Start the generate/approve/assemble deployment for EPISODE_ID once per request.

    If a flow run of the same request is already Scheduled, Pending, Running or Paused
    (created within EPISODIC_DEDUP_WINDOW_S) it is returned instead (deduplicated). Needs
    PREFECT_API_URL and the deployments (`episodic serve` or `prefect deploy`).
    """
    import episodic.tasks  # noqa: F401  (Prefect defaults before Prefect is imported)
    from episodic.flows.dispatch import dispatch as start

    result = start(
        context.engine(),
        context.settings(),
        context.pipeline_name(pipeline),
        command.value,
        episode_id,
        idempotency_key=idempotency_key,
        allow_duplicate=allow_duplicate,
    )
    if as_json:
        emit_json(result.to_dict())
        return
    if result.deduplicated:
        typer.echo(
            f"deduplicated: flow run {result.flow_run_name} ({result.flow_run_id}) of "
            f"{result.deployment} is already {result.state} for this request"
        )
    else:
        typer.echo(
            f"started flow run {result.flow_run_name} ({result.flow_run_id}) of "
            f"{result.deployment}: {result.state}"
        )
