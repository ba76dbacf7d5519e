"""Where the ledger records paid media, for the commands that repair it: `episodic media
restore` (a completed image, and the job that made it) and `episodic media import` (rows
whose file is a legacy absolute path, from before the media store).

Both only ever *add* a media store key to a row whose bytes are proven to be the recorded
ones: each write is guarded by the recorded sha256 (and for the import by the legacy path
it read), so the evidence of what was paid for is never rewritten, and a second run finds
nothing left to do. No state moves here (a completed item stays completed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sqlalchemy import Engine, Table, and_, or_, select, update

from core.media import StoredMedia
from core.playlist import item_label
from core.states import ItemState
from storage import tx
from storage.ledger import completed_images
from storage.models import CostEntryRow, EpisodeMediaRow, EpisodeRow, ItemRow, SubmissionRow
from storage.tx import idempotent, retry_outages

_items: Table = ItemRow.__table__  # type: ignore[assignment]
_subs: Table = SubmissionRow.__table__  # type: ignore[assignment]
_costs: Table = CostEntryRow.__table__  # type: ignore[assignment]
_media: Table = EpisodeMediaRow.__table__  # type: ignore[assignment]
_episodes: Table = EpisodeRow.__table__  # type: ignore[assignment]


@dataclass(frozen=True)
class RecordedImage:
    """A completed item's image as the ledger records it, with the paid call that made it:
    ``provider_profile`` and ``remote_ref`` (the provider's job, collected again for free),
    ``cost_minor`` in minor units of ``currency``. ``key``/``size``/``media_type`` are None
    for a legacy row, whose file is ``legacy_path``."""

    item_pk: int
    item_id: str  # v01.p2, v01.c3
    sha256: str
    key: str | None
    size: int | None
    media_type: str | None
    legacy_path: str | None
    provider_profile: str
    remote_ref: str | None
    cost_minor: int
    currency: str


FileKind = Literal["image", "cover", "manifest"]


@dataclass(frozen=True)
class LegacyFile:
    """A row whose media is only a legacy absolute ``path``: a completed item's image
    (``table`` items) or an episode's cover or manifest (``table`` episode_media)."""

    table: Literal["items", "episode_media"]
    pk: int
    pipeline: str
    episode_id: str
    label: str  # "image v01.p1", "cover", "manifest"
    kind: FileKind
    path: str
    sha256: str


@retry_outages
class MediaRecords:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def images(self, episode_pk: int) -> list[RecordedImage]:
        """The episode's completed images with their succeeded paid calls, in playlist
        order (position, part, candidate)."""
        with tx.read(self.engine) as conn:
            rows = conn.execute(
                completed_images(
                    episode_pk,
                    _items.c.id,
                    _items.c.video_id,
                    _items.c.part,
                    _items.c.candidate,
                    _items.c.output_sha256,
                    _items.c.output_key,
                    _items.c.output_size,
                    _items.c.output_media_type,
                    _items.c.output_path,
                    _subs.c.provider_profile,
                    _subs.c.remote_ref,
                    _costs.c.amount_minor,
                    _costs.c.currency,
                )
            ).all()
        return [
            RecordedImage(
                item_pk=row.id,
                item_id=item_label(row.video_id, row.part, row.candidate),
                sha256=row.output_sha256,
                key=row.output_key,
                size=row.output_size,
                media_type=row.output_media_type,
                legacy_path=row.output_path,
                provider_profile=row.provider_profile,
                remote_ref=row.remote_ref,
                cost_minor=row.amount_minor,
                currency=row.currency,
            )
            for row in rows
        ]

    @idempotent
    def record_image(self, item_pk: int, stored: StoredMedia) -> bool:
        """The completed item `item_pk` is now `stored` (key, size, media type) and no
        longer a legacy path. Guarded: only a completed item whose recorded sha256 is
        ``stored.sha256``; False (nothing written) otherwise."""
        with tx.write(self.engine) as conn:
            done = conn.execute(
                update(_items)
                .where(
                    _items.c.id == item_pk,
                    _items.c.state == ItemState.COMPLETED,
                    _items.c.output_sha256 == stored.sha256,
                )
                .values(
                    output_key=stored.key,
                    output_size=stored.size,
                    output_media_type=stored.media_type,
                    output_path=None,
                )
            )
            return bool(done.rowcount)

    def legacy_files(self) -> list[LegacyFile]:
        """Every row, of every pipeline, whose media is a legacy path and no store key:
        completed items' images, then episodes' covers and manifests; by episode."""
        with tx.read(self.engine) as conn:
            items = conn.execute(
                select(
                    _items.c.id,
                    _items.c.video_id,
                    _items.c.part,
                    _items.c.candidate,
                    _items.c.output_path,
                    _items.c.output_sha256,
                    _episodes.c.pipeline,
                    _episodes.c.episode_id,
                )
                .join(_episodes, _episodes.c.id == _items.c.episode_pk)
                .where(
                    _items.c.state == ItemState.COMPLETED,
                    _items.c.output_key.is_(None),
                    _items.c.output_path.is_not(None),
                )
                .order_by(_items.c.episode_pk, _items.c.position, _items.c.part, _items.c.id)
            ).all()
            media = conn.execute(
                select(
                    _media.c.id,
                    _media.c.kind,
                    _media.c.path,
                    _media.c.sha256,
                    _episodes.c.pipeline,
                    _episodes.c.episode_id,
                )
                .join(_episodes, _episodes.c.id == _media.c.episode_pk)
                .where(_media.c.key.is_(None), _media.c.path.is_not(None))
                .order_by(_media.c.episode_pk, _media.c.kind)
            ).all()
        found = [
            LegacyFile(
                "items",
                row.id,
                row.pipeline,
                row.episode_id,
                f"image {item_label(row.video_id, row.part, row.candidate)}",
                "image",
                row.output_path,
                row.output_sha256 or "",
            )
            for row in items
        ]
        found += [
            LegacyFile(
                "episode_media",
                row.id,
                row.pipeline,
                row.episode_id,
                row.kind,
                "manifest" if row.kind == "manifest" else "cover",
                row.path,
                row.sha256,
            )
            for row in media
        ]
        return found

    @idempotent
    def record_imported(self, legacy: LegacyFile, stored: StoredMedia) -> bool:
        """`legacy`'s row now names `stored` (key, size, media type) and its legacy path
        is cleared. Guarded by the path that was read and the recorded sha256: False
        (nothing written) when the row changed meanwhile (it names another key now)."""
        if legacy.table == "items":
            table, path, sha = _items, _items.c.output_path, _items.c.output_sha256
            values = {
                "output_key": stored.key,
                "output_size": stored.size,
                "output_media_type": stored.media_type,
                "output_path": None,
            }
            key = _items.c.output_key
        else:
            table, path, sha, key = _media, _media.c.path, _media.c.sha256, _media.c.key
            values = {
                "key": stored.key,
                "size": stored.size,
                "media_type": stored.media_type,
                "path": None,
            }
        with tx.write(self.engine) as conn:
            done = conn.execute(
                update(table)
                .where(
                    table.c.id == legacy.pk,
                    sha == stored.sha256,
                    # the path this import read, or this very import already committed
                    or_(and_(key.is_(None), path == legacy.path), key == stored.key),
                )
                .values(**values)
            )
            return bool(done.rowcount)
