"""`episodic episodes list|show`."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from episodic.cli import context
from episodic.cli.options import JsonOption, PipelineOption
from episodic.cli.output import emit_json, table

app = typer.Typer(help="Inspect episodes.", no_args_is_help=True)


@app.command("list")
def list_episodes(
    week: Annotated[str | None, typer.Option(help="Only this ISO week, e.g. 2026-W32.")] = None,
    pipeline: PipelineOption = None,
    as_json: JsonOption = False,
) -> None:
    """List the pipeline's episodes, oldest week first."""
    from episodic.core.ids import WeekId
    from episodic.storage.engine import database_label
    from episodic.storage.episodes import EpisodeRepository

    week_id = WeekId.parse(week) if week is not None else None
    name = context.pipeline_name(pipeline)
    engine = context.engine()
    episodes = EpisodeRepository(engine).list(name, week_id)
    if as_json:
        emit_json([episode.to_dict() for episode in episodes])
        return
    if not episodes:  # names the database: one started elsewhere is told where it looked
        week_text = f" for {week_id}" if week_id else ""
        typer.echo(
            f"no episodes in pipeline {name!r}{week_text} (database: {database_label(engine)})"
        )
        return
    table(
        f"pipeline {name}",
        ["episode", "week", "seq", "state", "allocation key", "created (UTC)"],
        (
            (
                e.episode_id,
                e.week_id,
                e.sequence,
                e.state,
                e.allocation_key,
                e.created_at.strftime("%Y-%m-%d %H:%M:%S"),
            )
            for e in episodes
        ),
    )


@app.command("show")
def show_episode(
    episode_id: Annotated[str, typer.Argument(help="Episode id, e.g. 2026-W32-0.")],
    pipeline: PipelineOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show one episode, its spend (every run, per currency), its history and its media:
    each completed image, cover and manifest by its media store key, and whether the store
    holds it. Exit 5 if it does not exist."""
    from episodic.core.ids import EpisodeId
    from episodic.core.money import format_totals
    from episodic.pipeline.media_view import episode_media
    from episodic.storage.episodes import EpisodeRepository
    from episodic.storage.ledger import LedgerStore

    parsed = EpisodeId.parse(episode_id)
    name = context.pipeline_name(pipeline)
    engine = context.engine()
    repository = EpisodeRepository(engine)
    episode = repository.get(name, parsed)
    history = repository.history(name, parsed)
    store = context.media_store(engine, read_only=True)
    episode_pk = repository.episode_pk(name, str(parsed))
    media = episode_media(engine, store, episode_pk)
    paid, costs = LedgerStore(engine).episode_spend(episode_pk)  # every run, per currency
    if as_json:
        emit_json(
            {
                **episode.to_dict(),
                "paid_submissions": paid,
                "costs": {currency: costs[currency] for currency in sorted(costs)},
                "cost": format_totals(costs),
                "history": [event.to_dict() for event in history],
                "media_store": store.describe(),
                "media": media,
            }
        )
        return
    for label, value in episode.to_dict().items():
        typer.echo(f"{label:>15}: {value}")
    typer.echo(f"{'spend':>15}: {format_totals(costs)} ({paid} paid calls, every run)")
    typer.echo(f"{'media store':>15}: {store.describe()}")
    table(
        "history",
        ["at (UTC)", "event", "detail"],
        ((ev.at.strftime("%Y-%m-%d %H:%M:%S"), ev.kind, _in_words(ev.detail)) for ev in history),
    )
    if media:
        table(
            "media",
            ["medium", "key (or legacy file)", "sha256", "bytes", "stored"],
            (
                (m["name"], m["key"] or m["legacy_path"], m["sha256"][:12], m["size"], m["stored"])
                for m in media
            ),
        )


def _in_words(detail: dict[str, Any]) -> str:
    """An event's detail as a line of words, e.g. ``allocation key flow-run:1f2e, run id
    86b6`` (``--json`` keeps the structure): keys with their underscores as spaces, lists
    joined by commas, nested mappings in parentheses; nothing for an empty detail."""

    def value(item: Any) -> str:
        if isinstance(item, dict):
            return f"({_in_words(item)})"
        if isinstance(item, list | tuple):
            return ", ".join(value(v) for v in item) or "none"
        return "none" if item is None else str(item)

    return "; ".join(
        f"{str(key).replace('_', ' ')} {value(item)}"
        for key, item in detail.items()
        if item is not None  # an unset field says nothing
    )
