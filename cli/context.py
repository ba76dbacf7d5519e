"""What a command needs from its environment: validated settings and an engine."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from episodic.core.settings import Settings
    from episodic.storage.media import MediaStore


def settings() -> Settings:
    from episodic.core.settings import load_settings

    return load_settings()


def pipeline_name(explicit: str | None) -> str:
    from episodic.core.settings import validate_pipeline

    return validate_pipeline(explicit) if explicit is not None else settings().pipeline


def engine(*, read_only: bool = False) -> Engine:
    from episodic.storage.registry import engine_for

    return engine_for(settings(), read_only=read_only)


def media_store(engine: Engine, *, adopt: bool = False, read_only: bool = False) -> MediaStore:
    """The media store the settings name (EPISODIC_MEDIA_URL), opened once per command: a
    local folder that does not exist is refused, and a store that is not the one `engine`'s
    database records (``adopt``: a command that writes media records it when none is;
    `episodic.pipeline.media_view.open_store`). ``read_only``: a command that only reads and reports
    goes on at the recorded address when the store's marker is missing, with a note on
    stderr naming the command that writes it again."""
    from episodic.pipeline.media_view import open_store

    store = open_store(settings(), engine, adopt=adopt, read_only=read_only)
    if read_only:
        import typer

        from episodic.storage.store_identity import marker_missing

        if marker_missing(engine, store):
            typer.echo(f"note: {MARKER_NOTE.format(store=store.describe())}", err=True)
    return store


MARKER_NOTE = (
    "media store {store} has lost its marker (episodic-store.json): only commands that read "
    "go on; `episodic media restore-marker` checks a sample of its images and writes it again"
)


def resolve_run_id(text: str) -> str:
    """A run id as typed (whole, or a unique prefix of 4+ characters): the whole id.
    Raises `InvalidInput` (exit 2): malformed, no run starts so, or several do."""
    from episodic.core.ids import parse_run_ref
    from episodic.storage.runs import RunStore

    value, is_prefix = parse_run_ref(text)
    return RunStore(engine()).run_id_starting(value) if is_prefix else value
