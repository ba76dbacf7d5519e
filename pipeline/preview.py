"""`episodic preview`: a contact sheet of exactly what an approval is about, before it.

The images are the review set the approval uses (`episodic.pipeline.approval.planned_images`: the
current plan's completed images, read from the media store and checked against the sha256
paid for), so the sheet made on any machine with the store shows what would ship. Each tile
carries the video's title from the frozen plan and its item id; a hero video's candidates
share one row, numbered as ``approve --pick VIDEO=N`` numbers them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from episodic.core.errors import CommandNotAllowed
from episodic.core.hints import hint
from episodic.core.output_files import RecordPaths, write_output
from episodic.core.records import EpisodeImage
from episodic.core.settings import Settings
from episodic.pipeline.approval import hero_outputs, planned_images
from episodic.pipeline.contact_sheet import Tile, compose
from episodic.pipeline.gate import GatePass, open_gate
from episodic.pipeline.playlists import parse_playlist, planned_items
from episodic.storage.ledger import completed_outputs
from episodic.storage.media import MediaStore
from episodic.storage.plans import PlanStore

PREVIEW_FILE = "preview.png"
PARTS_PER_ROW = 4


@dataclass(frozen=True, slots=True)
class PlanTexts:
    """What people read about a plan's images: video id -> title, idempotency key -> the
    prompt it was generated from, in plan order."""

    titles: dict[str, str]
    prompts: dict[str, str]

    def title(self, video_id: str) -> str:
        return self.titles.get(video_id, video_id)


def plan_texts(engine: Engine, episode_pk: int, episode_id: str, pipeline: str) -> PlanTexts:
    """The titles and prompts of the episode's current (frozen) plan; empty without one."""
    recorded = PlanStore(engine).latest_plan(episode_pk)
    if recorded is None:
        return PlanTexts({}, {})
    playlist = parse_playlist(recorded[0], "recorded plan")
    items = planned_items(recorded[0], recorded[1], episode_id, pipeline)
    return PlanTexts(
        {video.video_id: video.title for video in playlist.videos},
        {item.idempotency_key: item.prompt for item in items},
    )


def candidate_label(image: EpisodeImage) -> str:
    """A hero candidate's label as `approve --pick` numbers it: ``v01 candidate 2
    (pick v01=2)``; no ``--``: at the label's 12 px (11 on a cover) two dashes read as one."""
    return f"{image.video_id} candidate {image.candidate} (pick {image.video_id}={image.candidate})"


def sheet_rows(images: list[tuple[EpisodeImage, bytes]], texts: PlanTexts) -> list[list[Tile]]:
    """The rows of the contact sheet: the parts of videos in plan order, `PARTS_PER_ROW` to
    a row, then one row per hero video holding its candidates side by side in candidate
    order."""
    outputs = [image for image, _ in images]
    content = {image.idempotency_key: data for image, data in images}
    parts = [
        Tile(content[o.idempotency_key], texts.title(o.video_id), o.item_id)
        for o in outputs
        if o.candidate is None
    ]
    rows = [parts[n : n + PARTS_PER_ROW] for n in range(0, len(parts), PARTS_PER_ROW)]
    for video, candidates in hero_outputs(outputs).items():
        rows.append(
            [
                Tile(content[c.idempotency_key], texts.title(video), candidate_label(c))
                for c in candidates
            ]
        )
    return rows


def missing_images(engine: Engine, gate: GatePass) -> list[str]:
    """The item ids of the current plan's images that are not completed (plan order)."""
    recorded = PlanStore(engine).latest_plan(gate.episode_pk)
    if recorded is None:
        raise CommandNotAllowed(
            f"episode {gate.episode_id} has no plan: nothing to preview: "
            + hint(
                f"`episodic plan {gate.episode_id} --playlist FILE` and generate it first",
                "plan and generate it first",
            )
        )
    done = {o.idempotency_key for o in completed_outputs(engine, gate.episode_pk)}
    planned = planned_items(recorded[0], recorded[1], gate.episode_id, gate.pipeline)
    return [item.item_id for item in planned if item.idempotency_key not in done]


def default_path(settings: Settings, pipeline: str, episode_id: str) -> Path:
    """Where the sheet goes without --out: ``preview.png`` in the episode's folder of the
    state folder."""
    return settings.episode_folder(pipeline, episode_id) / PREVIEW_FILE


def preview(
    engine: Engine,
    settings: Settings,
    pipeline: str,
    episode_id: str,
    *,
    store: MediaStore,
    out: Path | None = None,
) -> dict[str, Any]:
    """Write the contact sheet of `episode_id`'s review set to `out` (default:
    `default_path`) and answer what it shows. Works in any state once every planned image
    is completed (before approval, which is its point). Refused (exit 2, nothing written):
    no plan; images not completed (named); an image missing from `store` or not the bytes
    paid for. An unknown episode is exit 5."""
    # a user-named file never writes over the record (refused before anything is read);
    # the default place is the project's own, in the episode's folder of the state folder
    keep = RecordPaths.of(settings) if out is not None else RecordPaths()
    if out is not None:
        keep.refuse(out, f"--out {out}")
    gate = open_gate(engine, pipeline, episode_id, "preview")
    missing = missing_images(engine, gate)
    if missing:
        shown = ", ".join(missing[:10]) + (", ..." if len(missing) > 10 else "")
        raise CommandNotAllowed(
            f"episode {gate.episode_id}: {len(missing)} planned images are not completed "
            f"({shown}): nothing to preview: "
            + hint(f"`episodic generate {gate.episode_id}` first", "generate it first")
        )
    images = planned_images(engine, gate, store)
    texts = plan_texts(engine, gate.episode_pk, gate.episode_id, gate.pipeline)
    content, placed = compose(sheet_rows(images, texts))
    path = out if out is not None else default_path(settings, pipeline, gate.episode_id)
    path = path.expanduser().absolute()
    _write(path, content, keep)
    outputs = [image for image, _ in images]
    return {
        "episode_id": gate.episode_id,
        "path": str(path),
        "images": len(outputs),
        "tiles": [
            {"title": p.title, "label": p.label, "row": p.row, "column": p.column} for p in placed
        ],
        "heroes": {video: len(cs) for video, cs in hero_outputs(outputs).items()},
    }


def _write(path: Path, content: bytes, keep: RecordPaths) -> None:
    """Write `content` to `path` whole (a temporary file renamed over it, normal
    permissions), its folder made when missing; an unwritable place, a part of the record
    (`keep`), or a target that is not a regular file (a folder, symlink, device, FIFO), is
    bad input (exit 2), one line."""
    write_output(path, content, f"--out {path}", keep=keep)
