"""Use cases behind `episodic plan|generate|retry|runs resume` (and the generate flow)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine

from core.errors import CommandNotAllowed
from core.playlist import PlannedItem
from core.settings import Settings
from pipeline.engine import ItemExecutor, RunEngine, thread_pool_executor
from pipeline.gate import CredentialSource, GatePass, build_provider, open_gate
from pipeline.playlists import load_playlist, planned_items, playlist_sha256
from providers.profiles import Profile, get_profile, load_profiles
from storage.claims import ClaimStore
from storage.runs import RunStore


@dataclass(frozen=True, slots=True)
class Prepared:
    gate: GatePass
    items: list[PlannedItem]
    profile: Profile


def record_plan(
    engine: Engine, pipeline: str, episode_id: str, playlist_path: Path
) -> dict[str, object]:
    """`episodic plan`: validate the playlist and record it for an existing episode."""
    gate = open_gate(engine, pipeline, episode_id, "plan")
    playlist, references = load_playlist(playlist_path)
    store = RunStore(engine)
    stored = store.record_plan(
        gate.episode_pk,
        playlist.model_dump(mode="json"),
        playlist_sha256(playlist),
        references,
        str(playlist_path),
    )
    items = planned_items(playlist.model_dump(mode="json"), references, gate.episode_id)
    return {
        "episode_id": gate.episode_id,
        "recorded": stored,
        "videos": len(playlist.items),
        "images": len(items),
        "provider_profile": playlist.provider_profile,
        "template": f"{playlist.template.id} v{playlist.template.version}",
    }


def prepare(
    engine: Engine, settings: Settings, pipeline: str, episode_id: str, command: str
) -> Prepared:
    """The gate first, then the recorded plan and the provider profile. No credential yet."""
    gate = open_gate(engine, pipeline, episode_id, command)
    recorded = RunStore(engine).latest_plan(gate.episode_pk)
    if recorded is None:
        raise CommandNotAllowed(
            f"episode {gate.episode_id} has no plan: run `episodic plan {gate.episode_id} "
            "--playlist FILE` first"
        )
    playlist, references = recorded
    items = planned_items(playlist, references, gate.episode_id)
    profile = get_profile(
        load_profiles(settings.providers_path), str(playlist.get("provider_profile", "fake"))
    )
    return Prepared(gate, items, profile)


def run_engine(
    engine: Engine,
    settings: Settings,
    prepared: Prepared,
    credentials: CredentialSource,
    executor: ItemExecutor = thread_pool_executor,
    stop: threading.Event | None = None,
) -> RunEngine:
    """Build the provider (through the gate) and the engine that runs items with it."""
    provider = build_provider(prepared.gate, prepared.profile, credentials, settings.home_path)
    return RunEngine(
        store=RunStore(engine),
        claims=ClaimStore(engine),
        gate=prepared.gate,
        provider=provider,
        profile=prepared.profile,
        output_dir=settings.episodes_path / prepared.gate.episode_id / "images",
        executor=executor,
        stop=stop or threading.Event(),
        planned_keys=frozenset(item.idempotency_key for item in prepared.items),
    )
