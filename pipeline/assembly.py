"""Assembling an approved episode (DESIGN 7).

Assembly composes the cover from the approved images and writes a manifest; it is
deterministic (same approved inputs, same bytes), records the hashes, and rerunning it
changes nothing.
"""

from __future__ import annotations

import io
import json
import math
import os
from pathlib import Path
from typing import Any

from core.errors import CommandNotAllowed, InvalidInput
from core.hints import hint
from core.playlist import check_picks
from core.records import EpisodeImage
from core.settings import Settings
from core.states import EpisodeState
from pipeline.approval import hero_outputs, planned_outputs
from pipeline.gate import open_gate
from pipeline.media import image_file, write_atomically
from storage.approvals import ApprovalStore
from storage.episodes import EpisodeRepository
from storage.tx import Database

THUMB = 128


def assemble(
    engine: Database, settings: Settings, pipeline: str, episode_id: str
) -> dict[str, Any]:
    """Compose the cover and the manifest of an approved episode; record their hashes."""
    gate = open_gate(engine, pipeline, episode_id, "assemble")
    review = ApprovalStore(engine)
    episodes = EpisodeRepository(engine)
    state = episodes.state(gate.episode_pk)
    if state not in (EpisodeState.APPROVED, EpisodeState.ASSEMBLED):
        raise CommandNotAllowed(
            f"episode {gate.episode_id} is {state}: only an approved episode is assembled"
        )
    outputs = planned_outputs(engine, gate)
    approved = review.approved_items(gate.episode_pk)
    shipping = {o.idempotency_key: o.sha256 for o in outputs}
    if approved is not None and shipping != approved:
        raise CommandNotAllowed(
            f"episode {gate.episode_id}: its images are not the ones that were approved "
            f"({len(set(shipping.items()) ^ set(approved.items()))} differ); nothing was "
            "assembled: "
            + hint(
                f"`episodic reopen {gate.episode_id}` and review it again",
                "reopen it (`episodic reopen`) and run the approve deployment again",
            )
        )
    heroes = hero_outputs(outputs)
    picks = review.approved_picks(gate.episode_pk)
    if heroes:
        try:
            check_picks(picks, heroes, "the approval's picks")
        except InvalidInput as exc:
            raise CommandNotAllowed(
                f"episode {gate.episode_id}: {exc}; nothing was assembled: "
                + hint(
                    f"`episodic reopen {gate.episode_id}` and approve it again with --pick",
                    "reopen it (`episodic reopen`) and approve it again with a pick",
                )
            ) from None
    shipped = [o for o in outputs if o.candidate in (None, picks.get(o.video_id))]
    folder = settings.episode_folder(gate.pipeline, gate.episode_id)
    files = {o.idempotency_key: image_file(o, settings) for o in shipped}
    cover = _cover([files[o.idempotency_key] for o in shipped])
    cover_sha = write_atomically(folder / "cover.png", cover)
    manifest = _manifest(gate.episode_id, shipped, files, folder, cover_sha, heroes, picks)
    manifest_sha = write_atomically(folder / "manifest.json", manifest)
    media = {
        "cover": (str(folder / "cover.png"), cover_sha),
        "manifest": (str(folder / "manifest.json"), manifest_sha),
    }
    changed = episodes.record_media(gate.episode_pk, media)
    if state == EpisodeState.APPROVED:
        episodes.transition(
            gate.episode_pk,
            EpisodeState.ASSEMBLED,
            {"cover_sha256": cover_sha, "manifest_sha256": manifest_sha},
        )
    return {
        "episode_id": gate.episode_id,
        "state": EpisodeState.ASSEMBLED.value,
        "changed": changed or state == EpisodeState.APPROVED,
        "cover": media["cover"][0],
        "cover_sha256": cover_sha,
        "manifest": media["manifest"][0],
        "manifest_sha256": manifest_sha,
        "images": len(shipped),
        **({"picks": picks} if heroes else {}),
    }


def _cover(paths: list[Path]) -> bytes:
    """A grid of thumbnails in playlist order: same inputs, same PNG bytes."""
    from PIL import Image

    columns = math.ceil(math.sqrt(len(paths)))
    rows = math.ceil(len(paths) / columns)
    sheet = Image.new("RGB", (columns * THUMB, rows * THUMB), (16, 16, 16))
    for n, path in enumerate(paths):
        with Image.open(path) as image:
            thumb = image.convert("RGB").resize((THUMB, THUMB), Image.Resampling.NEAREST)
        sheet.paste(thumb, ((n % columns) * THUMB, (n // columns) * THUMB))
    out = io.BytesIO()
    sheet.save(out, format="PNG", optimize=False)
    return out.getvalue()


def _manifest(
    episode_id: str,
    shipped: list[EpisodeImage],
    files: dict[str, Path],
    folder: Path,
    cover_sha: str,
    heroes: dict[str, list[EpisodeImage]],
    picks: dict[str, int],
) -> bytes:
    """Canonical JSON, paths relative to the episode folder, no timestamps: deterministic.

    `files`: each shipped image's file on this machine, by item key (`image_file`); an
    image of the media store also names its ``key``. `items`: the images that ship (a hero
    video's picked candidate among them). With hero runs, `heroes` records each hero
    video's pick and every candidate's key, sha256 and cost, and `total_cost_minor` counts
    every paid candidate, picked or not."""
    items = []
    for o in shipped:
        item: dict[str, Any] = {
            "item_id": o.item_id,
            "idempotency_key": o.idempotency_key,
            # its file here, relative to the episode folder (`image_file`)
            "path": os.path.relpath(files[o.idempotency_key], folder),
            **({"key": o.key} if o.key is not None else {}),  # in the media store
            "sha256": o.sha256,
            "remote_ref": o.remote_ref,
            "cost_minor": o.cost_minor,
            "currency": o.currency,
        }
        if o.candidate is not None:
            item["candidate"] = o.candidate
        items.append(item)
    unpicked = [c for video, cs in heroes.items() for c in cs if c.candidate != picks.get(video)]
    document: dict[str, Any] = {
        "episode_id": episode_id,
        "cover": {"path": "cover.png", "sha256": cover_sha},
        "items": items,
        "total_cost_minor": sum(o.cost_minor for o in [*shipped, *unpicked]),
        "currency": shipped[0].currency,
    }
    if heroes:
        document["heroes"] = [
            {
                "video_id": video,
                "picked": picks[video],
                "candidates": [
                    {
                        "candidate": c.candidate,
                        "idempotency_key": c.idempotency_key,
                        "sha256": c.sha256,
                        "remote_ref": c.remote_ref,
                        "cost_minor": c.cost_minor,
                    }
                    for c in candidates
                ],
            }
            for video, candidates in heroes.items()
        ]
    return (json.dumps(document, indent=2, sort_keys=True) + "\n").encode()
