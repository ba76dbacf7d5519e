"""`episodic preview`, `episodic approve`, `episodic assemble` and `episodic reopen`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from episodic.cli import context
from episodic.cli.options import JsonOption, PipelineOption
from episodic.cli.output import emit_json

if TYPE_CHECKING:
    from episodic.pipeline.approval import ApprovalContext

EpisodeArg = Annotated[str, typer.Argument(help="Episode id, e.g. 2026-W32-0 (must exist).")]


def approve(
    episode_id: EpisodeArg,
    by: Annotated[str, typer.Option("--by", help="Who decides (recorded).")],
    reject: Annotated[bool, typer.Option("--reject", help="Reject instead of approving.")] = False,
    note: Annotated[str | None, typer.Option("--note", help="A note with the approval.")] = None,
    reason: Annotated[
        str | None, typer.Option("--reason", help="Why (required to reject).")
    ] = None,
    pick: Annotated[
        str | None,
        typer.Option(
            "--pick",
            help="The hero candidate that ships, per hero video, e.g. v01=2,v02=1 (required "
            "for each hero video).",
        ),
    ] = None,
    pipeline: PipelineOption = None,
    as_json: JsonOption = False,
) -> None:
    """Approve (or --reject) a generated episode's images. Recorded with who and when.
    A plan with hero runs is approved with the candidate that ships for each hero video.
    Then the Prefect flow run waiting at the episode's approval form (PREFECT_API_URL) is
    resumed with this decision, so it goes on (assembles, or ends Rejected); one more line
    says which run was resumed, or that none was (the decision is recorded either way)."""
    from episodic.core.playlist import parse_picks
    from episodic.pipeline.approval import approval_context, decide

    picks = parse_picks(pick) if pick is not None else None
    engine = context.engine()
    name = context.pipeline_name(pipeline)
    store = context.media_store(engine)
    result = decide(
        engine,
        name,
        episode_id,
        approve=not reject,
        by=by,
        note=reason if reject else note,
        labels=("--by", "--reason" if reject else "--note"),
        picks=picks,
        store=store,
    )
    # recorded first (the database is the truth), then the waiting run follows it
    result["resumed"] = _resume_waiting_run(
        approval_context(engine, name, result["episode_id"], store)
    )
    if as_json:
        emit_json(result)
    else:
        verb = "already" if not result["changed"] else "now"
        chosen = result.get("picks")
        shipped = (
            f" (ships {', '.join(f'{v} candidate {n}' for v, n in chosen.items())})"
            if chosen
            else ""
        )
        typer.echo(f"{result['episode_id']} is {verb} {result['state']}{shipped}")
        typer.echo(f"  prefect: {result['resumed']['message']}")


def _resume_waiting_run(approval: ApprovalContext) -> dict[str, Any]:
    """Resume the Prefect flow run waiting for this (recorded) decision, if any. Without
    PREFECT_API_URL (as `replay` and `sweep` read it) there is no run to resume, and Prefect
    is not imported (about 2 s of a command that runs no flow)."""
    import os

    from episodic.pipeline.approval import NO_PREFECT_API

    if not os.environ.get("PREFECT_API_URL"):
        return {"flow_run": None, "message": NO_PREFECT_API}
    import episodic.tasks  # noqa: F401  (Prefect defaults before Prefect is imported)
    from episodic.flows.approval.resume import resume_waiting_run

    return resume_waiting_run(approval).as_dict()


def assemble(
    episode_id: EpisodeArg,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Also copy the cover, the manifest and the images it names to this local "
            "folder (the media store stays the record).",
        ),
    ] = None,
    pipeline: PipelineOption = None,
    as_json: JsonOption = False,
) -> None:
    """Assemble an approved episode (cover, manifest, in the media store); rerunning it
    changes nothing."""
    from episodic.pipeline.assembly import assemble as run_assembly

    engine = context.engine()
    result = run_assembly(
        engine,
        context.settings(),
        context.pipeline_name(pipeline),
        episode_id,
        store=context.media_store(engine, adopt=True),
        out=out,
    )
    if as_json:
        emit_json(result)
    else:
        local = result.get("local", {})
        typer.echo(
            f"{result['episode_id']} assembled ({result['images']} images)"
            f"{'' if result['changed'] else ', unchanged'} in the media store {result['store']}"
            f"\n  cover    {result['cover']}"
            f"\n  manifest {result['manifest']}"
            + "".join(f"\n  copied   {path}" for path in local.values())
        )


def reopen(
    episode_id: EpisodeArg,
    by: Annotated[str, typer.Option("--by", help="Who reopens it (recorded).")],
    reason: Annotated[str, typer.Option("--reason", help="Why (recorded).")],
    pipeline: PipelineOption = None,
    as_json: JsonOption = False,
) -> None:
    """Undo a decision, recorded: unfreeze an approved or assembled episode's plan (the
    approval is reset), or send a rejected episode back for review as it is. History keeps
    the earlier plan and decision. Then (plan,) generate and decide it again."""
    from episodic.pipeline.approval import reopen as run_reopen

    engine = context.engine()
    store = context.media_store(engine)
    result = run_reopen(
        engine,
        context.pipeline_name(pipeline),
        episode_id,
        by=by,
        reason=reason,
        store=store,
    )
    if as_json:
        emit_json(result)
    else:
        typer.echo(
            f"{result['episode_id']} reopened (was {result['from']}): plan, generate and "
            "approve it again"
        )
        if missing := result["missing"]:
            typer.echo(
                f"  {len(missing)} images are not in the media store {store.describe()} "
                f"({', '.join(missing[:5])}{', ...' if len(missing) > 5 else ''}): "
                f"`episodic media restore {result['episode_id']}` fetches them at no cost"
            )


def preview(
    episode_id: EpisodeArg,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Write the contact sheet (PNG) to this file [default: preview.png in the "
            "episode's folder of the state folder].",
        ),
    ] = None,
    pipeline: PipelineOption = None,
    as_json: JsonOption = False,
) -> None:
    """Write a contact sheet (PNG) of exactly the images an approval is about, each titled
    with its video's title and id, hero candidates side by side numbered as --pick numbers
    them; prints where it is. Works before approval; refused until every planned image is
    generated."""
    from episodic.pipeline.preview import preview as run_preview

    engine = context.engine(read_only=True)
    name = context.pipeline_name(pipeline)
    result = run_preview(
        engine,
        context.settings(),
        name,
        episode_id,
        store=context.media_store(engine, read_only=True),
        out=out,
    )
    if as_json:
        emit_json(result)
    else:
        heroes = result["heroes"]
        picks = (
            f"; hero candidates: {', '.join(f'{v} 1-{n}' for v, n in heroes.items())} "
            "(approve --pick VIDEO=N)"
            if heroes
            else ""
        )
        typer.echo(f"{result['episode_id']}: {result['images']} images{picks}")
        typer.echo(result["path"])
