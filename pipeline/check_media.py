"""`episodic check`'s reads of media: every completed image, cover and manifest as the
media store holds it under its recorded key (or, for a row from before the store, as its
local file holds it), judged on the bytes themselves.

An object is a finding when it is missing, holds another size or sha256 than recorded, or
(an image) does not decode in full as the recorded media type. The decoding rule is the
auditor's own (Pillow, every pixel loaded), not the paid path's `prove_image`: an auditor
that shares a predicate with the code it audits is blind to a bug in it.
"""

from __future__ import annotations

import hashlib
import io
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from episodic.core.errors import InvalidInput, MediaMissing
from episodic.core.ids import EpisodeId
from episodic.storage.admission import DedupPolicy
from episodic.storage.audit import ItemRecord, MediaRecord, list_episodes, snapshot
from episodic.storage.media import MediaStore


@dataclass(frozen=True, slots=True)
class Recorded:
    """What the database records of one medium: its store key with sha256, size and media
    type, or (a row from before the store) only the local file's path and sha256."""

    key: str | None
    sha256: str | None
    size: int | None
    media_type: str | None
    legacy_path: str | None

    @classmethod
    def of_item(cls, item: ItemRecord) -> Recorded:
        return cls(
            item.output_key,
            item.output_sha256,
            item.output_size,
            item.output_media_type,
            item.output_path,
        )

    @classmethod
    def of_media(cls, row: MediaRecord) -> Recorded:
        return cls(row.key, row.sha256, row.size, row.media_type, row.path)


# Pillow's names of the formats a stored image may be, by recorded media type (the
# auditor's own list).
_DECODES_AS = {"image/png": "PNG", "image/jpeg": "JPEG", "image/webp": "WEBP"}


class MediaAudit:
    """The audit's reads of media: the store by key, a legacy row's local file by path."""

    def __init__(self, store: MediaStore) -> None:
        self.store = store

    def check(self, add: Any, label: str, recorded: Recorded, image: bool) -> bytes | None:
        """Add a finding for each way the medium is not what was recorded; returns the bytes
        read (even when they differ: a tampered manifest is still audited), None when there
        are none."""
        if not recorded.sha256 or not (recorded.key or recorded.legacy_path):
            add("files", f"{label} has no recorded key or sha256")
            return None
        if recorded.key is not None:
            where = f"{recorded.key} in the media store {self.store.describe()}"
            try:
                content = self.store.read(recorded.key)
            except MediaMissing:
                add("files", f"{label} is missing from the media store: {where}")
                return None
            except InvalidInput:  # not a key this project writes
                add("files", f"{label} has an invalid media key: {recorded.key[:80]!r}")
                return None
        else:
            where = str(recorded.legacy_path)
            file = Path(where)
            if not file.is_file():
                add("files", f"{label} is missing: {where}")
                return None
            content = file.read_bytes()
        if recorded.size is not None and len(content) != recorded.size:
            add(
                "files",
                f"{label} does not match its recorded size ({len(content)} bytes, "
                f"{recorded.size} recorded): {where}",
            )
            return content
        if hashlib.sha256(content).hexdigest() != recorded.sha256:
            add("files", f"{label} does not match its recorded sha256: {where}")
            return content
        if image and (problem := _not_an_image(content, recorded.media_type)) is not None:
            add("files", f"{label} {problem}: {where}")
        return content


def _not_an_image(content: bytes, media_type: str | None) -> str | None:
    """Why `content` is not a whole image of `media_type` (None: it is; a legacy row
    without a recorded type may be any of them)."""
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(content), formats=list(_DECODES_AS.values())) as opened:
                found = opened.format
                opened.load()
    except Exception as exc:  # every way Pillow refuses bytes is a finding here
        return f"does not decode as a PNG, JPEG or WEBP image ({type(exc).__name__})"
    wanted = _DECODES_AS.get(media_type or "")
    if media_type is not None and found != wanted:
        return f"decodes as {found}, recorded as {media_type}"
    return None


def legacy_media(
    engine: Engine, pipeline: str, episode_id: str | None = None
) -> list[tuple[str, str]]:
    """(episode id, detail) of each episode whose images or media are still local files
    from before the media store (rows with a path and no key), readable on this machine
    only: `episodic media import` copies them into the store, verifying every hash, paying
    nothing."""
    wanted = None if episode_id is None else str(EpisodeId.parse(episode_id))
    out = []
    for episode in list_episodes(engine, pipeline, wanted):
        with snapshot(engine) as reader:
            seen = reader.episode(episode.id, DedupPolicy())
        local = [i for i in seen.items if i.state == "completed" and i.output_key is None]
        media = [m for m in seen.media if m.key is None]
        if local or media:
            what = ", ".join(
                part
                for part in (
                    f"{len(local)} images" if local else "",
                    " and ".join(m.kind for m in media),
                )
                if part
            )
            out.append(
                (
                    episode.episode_id,
                    f"{what} are local files from before the media store, readable on this "
                    "machine only: `episodic media import` copies them into the store",
                )
            )
    return out
