"""`episodic serve`: serve every deployment from this process against the configured API."""

from __future__ import annotations


def serve() -> None:
    """Serve the project's deployments (weekly schedule included) until interrupted.

    Uses PREFECT_API_URL when set (e.g. a `prefect server start` on this machine), otherwise
    Prefect's local ephemeral server.
    """
    import tasks  # noqa: F401  (Prefect defaults before Prefect is imported)
    from deployments.serve import serve_all

    serve_all()
