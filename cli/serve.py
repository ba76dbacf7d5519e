"""`episodic serve`: serve every deployment from this process against the configured API."""

from __future__ import annotations

from typing import Annotated

import typer

from episodic.cli.options import PipelineOption


def serve(
    pipeline: PipelineOption = None,
    playlist: Annotated[
        str,
        typer.Option(help="Playlist the weekly deployment plans from (relative: this folder)."),
    ] = "examples/playlist.yaml",
) -> None:
    """Serve the project's deployments (weekly Mon + Thu 09:00, plan, generate, approve,
    assemble, sweep) until interrupted, after `episodic prefect setup`.

    Uses PREFECT_API_URL when set (e.g. a `prefect server start` on this machine), otherwise
    Prefect's local ephemeral server. Refuses to take over deployments `prefect deploy`
    registered for a work pool.
    """
    import episodic.tasks  # noqa: F401  (Prefect defaults before Prefect is imported)
    from episodic.cli import context
    from episodic.deployments.serve import serve_all

    serve_all(context.pipeline_name(pipeline), playlist)
