"""Assembling an approved episode.

Assembly reads the approved images from the media store (each checked against the sha256
paid for), composes the cover from them and writes a manifest that names every image by its
store key; cover and manifest go to the store under their content keys, and the episode
records their keys, hashes, sizes and media types (never a machine path). It is
deterministic (same approved inputs, same bytes), and rerunning it changes nothing. With
``out``, a local copy of the episode is written as well; the store stays the record.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from episodic.core.errors import CommandNotAllowed, InvalidInput
from episodic.core.hints import hint
from episodic.core.media import StoredMedia
from episodic.core.output_files import RecordPaths
from episodic.core.playlist import check_picks
from episodic.core.records import EpisodeImage
from episodic.core.settings import Settings
from episodic.core.states import EpisodeState
from episodic.pipeline import contact_sheet
from episodic.pipeline.approval import hero_outputs, planned_images
from episodic.pipeline.contact_sheet import Tile
from episodic.pipeline.gate import open_gate
from episodic.pipeline.media import prove_image
from episodic.pipeline.preview import plan_texts
from episodic.storage.approvals import ApprovalStore
from episodic.storage.episodes import EpisodeRepository
from episodic.storage.media import MediaStore
from episodic.storage.store_identity import open_verified


def assemble(
    engine: Engine,
    settings: Settings,
    pipeline: str,
    episode_id: str,
    *,
    store: MediaStore | None = None,
    out: Path | None = None,
    out_is_ours: bool = False,
) -> dict[str, Any]:
    """Compose the cover and the manifest of an approved episode from the images in `store`
    (default: the settings' media store), store them, record their keys and hashes.

    `out`: also copy the episode to this local folder: ``cover.png``, ``manifest.json``,
    and every object the manifest names under its key (so the manifest's keys resolve
    inside the folder). `out` is a path a user named (`assemble --out`): never the record,
    nor anywhere in the state folder. `out_is_ours`: `out` is a folder the project chose in
    the state folder (the demo's): only the ledger, providers file and media store are
    refused. Returns the episode id, state, whether anything changed, the
    cover's and manifest's store keys and sha256, the store, the number of images, and with
    `out` the local copies' paths (``local``)."""
    keep = RecordPaths.of(settings, state_folder=not out_is_ours)
    if out is not None:  # never over the record: refused before anything is stored
        keep.refuse(Path(out), f"--out {out}")
    store = store if store is not None else open_verified(settings, engine, adopt=True)
    gate = open_gate(engine, pipeline, episode_id, "assemble")
    review = ApprovalStore(engine)
    episodes = EpisodeRepository(engine)
    state = episodes.state(gate.episode_pk)
    if state not in (EpisodeState.APPROVED, EpisodeState.ASSEMBLED):
        raise CommandNotAllowed(
            f"episode {gate.episode_id} is {state}: only an approved episode is assembled"
        )
    images = planned_images(engine, gate, store)
    outputs = [image for image, _ in images]
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
    shipped = [(o, b) for o, b in images if o.candidate in (None, picks.get(o.video_id))]
    texts = plan_texts(engine, gate.episode_pk, gate.episode_id, gate.pipeline)
    tiles = [Tile(content, texts.title(o.video_id), o.item_id) for o, content in shipped]
    cover_bytes = contact_sheet.cover(tiles)
    if state == EpisodeState.ASSEMBLED:  # assembled before titled covers: keep its bytes
        cover_bytes = _kept_cover(episodes, gate.episode_pk, cover_bytes, shipped)
    cover = store.put_image(prove_image(cover_bytes))
    manifest_bytes = _manifest(gate.episode_id, [o for o, _ in shipped], cover, heroes, picks)
    manifest = store.put_document(manifest_bytes)
    media = {"cover": cover, "manifest": manifest}
    changed = episodes.record_media(gate.episode_pk, media)
    if state == EpisodeState.APPROVED:
        episodes.transition(
            gate.episode_pk,
            EpisodeState.ASSEMBLED,
            {"cover_sha256": cover.sha256, "manifest_sha256": manifest.sha256},
        )
    result: dict[str, Any] = {
        "episode_id": gate.episode_id,
        "state": EpisodeState.ASSEMBLED.value,
        "changed": changed or state == EpisodeState.APPROVED,
        "cover": cover.key,
        "cover_sha256": cover.sha256,
        "manifest": manifest.key,
        "manifest_sha256": manifest.sha256,
        "store": store.describe(),
        "images": len(shipped),
        **({"picks": picks} if heroes else {}),
    }
    if out is not None:
        result["local"] = _local_copy(store, Path(out), media, [o for o, _ in shipped], keep)
    return result


def _local_copy(
    store: MediaStore,
    out: Path,
    media: dict[str, StoredMedia],
    shipped: list[EpisodeImage],
    keep: RecordPaths,
) -> dict[str, str]:
    """Copy the episode from `store` to the folder `out`, each object checked against its
    sha256: the cover and manifest by name, and the cover and shipped images under their
    keys (what the manifest names). Returns kind -> local path of the cover and manifest.
    A shipped legacy row (no key) is not copied; its manifest entry names its local file.
    No copy writes over the record (`keep`: each file is checked, the folder was)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidInput(f"--out {out}: {exc.strerror or exc}") from None
    named = {"cover": out / "cover.png", "manifest": out / "manifest.json"}
    for kind, stored in media.items():
        store.local_copy(stored.key, named[kind], sha256=stored.sha256, keep=keep)
    keyed = [(media["cover"].key, media["cover"].sha256)]
    keyed += [(o.key, o.sha256) for o in shipped if o.key is not None]
    for key, sha256 in keyed:
        store.local_copy(key, out / key, sha256=sha256, keep=keep)  # folder made, one line
    return {kind: str(path) for kind, path in named.items()}


def _kept_cover(
    episodes: EpisodeRepository,
    episode_pk: int,
    composed: bytes,
    shipped: list[tuple[EpisodeImage, bytes]],
) -> bytes:
    """The cover a reassembly stores: `composed`, unless the episode recorded the cover an
    earlier assembly made from the same images (`contact_sheet.untitled_cover`, before
    covers were titled): then those bytes again, so the rerun changes nothing (and puts a
    lost cover back)."""
    recorded = episodes.media(episode_pk).get("cover")
    if recorded is None or recorded.sha256 == hashlib.sha256(composed).hexdigest():
        return composed
    earlier = contact_sheet.untitled_cover([content for _, content in shipped])
    return earlier if hashlib.sha256(earlier).hexdigest() == recorded.sha256 else composed


def _manifest(
    episode_id: str,
    shipped: list[EpisodeImage],
    cover: StoredMedia,
    heroes: dict[str, list[EpisodeImage]],
    picks: dict[str, int],
) -> bytes:
    """Canonical JSON, every image and the cover named by its media store key (a key is
    the same on every machine; no paths), no timestamps: deterministic.

    `items`: the images that ship (a hero video's picked candidate among them), each with
    its key, sha256, size and media type (a row from before the store, with no key, names
    its ``legacy_path`` instead). With hero runs, `heroes` records each hero video's pick
    and every candidate's idempotency key, sha256 and cost, and `total_cost_micros` counts
    every paid candidate, picked or not."""
    items = []
    for o in shipped:
        item: dict[str, Any] = {
            "item_id": o.item_id,
            "idempotency_key": o.idempotency_key,
            "key": o.key,
            "media_type": o.media_type,
            "size": o.size,
            "sha256": o.sha256,
            "remote_ref": o.remote_ref,
            "cost_micros": o.cost_micros,
            "currency": o.currency,
        }
        if o.key is None:  # imported from before the store: not in it yet
            item["legacy_path"] = o.legacy_path
        if o.candidate is not None:
            item["candidate"] = o.candidate
        items.append(item)
    unpicked = [c for video, cs in heroes.items() for c in cs if c.candidate != picks.get(video)]
    document: dict[str, Any] = {
        "episode_id": episode_id,
        "cover": {
            "key": cover.key,
            "media_type": cover.media_type,
            "size": cover.size,
            "sha256": cover.sha256,
        },
        "items": items,
        "total_cost_micros": sum(o.cost_micros for o in [*shipped, *unpicked]),
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
                        "cost_micros": c.cost_micros,
                    }
                    for c in candidates
                ],
            }
            for video, candidates in heroes.items()
        ]
    return (json.dumps(document, indent=2, sort_keys=True) + "\n").encode()
