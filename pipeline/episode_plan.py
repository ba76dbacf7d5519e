"""An episode's plan: the playlist recorded for an existing episode (`episodic plan`, the plan
flow, the demo), and the summary of the plan already recorded, which a resumed run reads
instead of the playlist file. Generation (`episodic.pipeline.generation`) buys from it."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine

from episodic.pipeline.gate import open_gate
from episodic.pipeline.playlists import (
    check_profile_known,
    load_playlist,
    planned_items,
    playlist_sha256,
    playlist_unreadable,
    read_reference_image,
)
from episodic.storage.allocator import Allocator
from episodic.storage.plans import PlanStore


def refuse_unreadable_playlist(
    engine: Engine, pipeline: str, allocation_key: str, playlist_path: Path
) -> None:
    """Before a run allocates the episode it will plan from `playlist_path`: raise
    `InvalidPlaylist` (naming where the file was looked for) when the file cannot be read,
    unless `allocation_key` already owns its episode (a rerun, whose plan is recorded and
    not read again)."""
    unreadable = playlist_unreadable(playlist_path)
    if unreadable is not None and not Allocator(engine).owns_episode(pipeline, allocation_key):
        raise unreadable


def record_plan(
    engine: Engine,
    pipeline: str,
    episode_id: str,
    playlist_path: Path,
    *,
    providers_path: Path | None = None,
) -> dict[str, object]:
    """`episodic plan` and every planner (flows, demo): validate the playlist and its
    provider profile (`check_profile_known`), and record it for an existing episode."""
    gate = open_gate(engine, pipeline, episode_id, "plan")
    playlist, references = load_playlist(playlist_path)
    check_profile_known(playlist, str(playlist_path), providers_path)
    items = planned_items(
        playlist.model_dump(mode="json"), references, gate.episode_id, gate.pipeline
    )
    stored = PlanStore(engine).record_plan(  # frozen check and state change: one transaction
        gate.episode_pk,
        playlist.model_dump(mode="json"),
        playlist_sha256(playlist),
        references,
        str(playlist_path),
        read_reference_image(playlist_path, playlist, references),
    )
    return {
        "episode_id": gate.episode_id,
        "recorded": stored,
        "videos": len(playlist.videos),
        "images": len(items),
        "provider_profile": playlist.provider_profile,
        "template": f"{playlist.template.id} v{playlist.template.version}",
    }


def recorded_plan_summary(
    engine: Engine, pipeline: str, episode_id: str
) -> dict[str, object] | None:
    """The recorded plan of an episode, summarised as `record_plan` answers, or None.

    A resumed Prefect run uses it instead of reading the playlist file again: what was
    planned (and then approved) is what the run continues with.
    """
    gate = open_gate(engine, pipeline, episode_id, "plan")
    recorded = PlanStore(engine).latest_plan(gate.episode_pk)
    if recorded is None:
        return None
    playlist, references = recorded
    items = planned_items(playlist, references, gate.episode_id, gate.pipeline)
    template = playlist.get("template", {})
    return {
        "episode_id": gate.episode_id,
        "recorded": False,
        "videos": len(playlist.get("items", [])),
        "images": len(items),
        "provider_profile": playlist.get("provider_profile", "fake"),
        "template": f"{template.get('id')} v{template.get('version')}",
    }
