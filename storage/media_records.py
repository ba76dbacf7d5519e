"""Where the ledger records paid media, for the commands that repair it: `episodic media
restore` (a completed image, and the job that made it) and `episodic media import` (rows
whose file is a legacy absolute path, from before the media store).

Both only ever *add* a media store key to a row whose bytes are proven to be the recorded
ones: each write is guarded by the recorded sha256 (and for the import by the legacy path
it read), so the evidence of what was paid for is never rewritten, and a second run finds
nothing left to do. Restore and the import move no state; `lose` (`media restore
--buy-again`) sends a completed item whose image is lost back to pending, recording it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sqlalchemy import Engine, Table, and_, insert, or_, select, update

from episodic.core.errors import CommandNotAllowed
from episodic.core.media import StoredMedia
from episodic.core.playlist import item_label
from episodic.core.states import DECIDED_STATES, EpisodeState, ItemState
from episodic.storage import dbapi, predicates, statements, tx
from episodic.storage.base import utcnow
from episodic.storage.episodes import move_episode
from episodic.storage.ledger import completed_images
from episodic.storage.models import (
    CostEntryRow,
    EpisodeMediaRow,
    EpisodeRow,
    ItemRow,
    LostOutputRow,
    RunItemRow,
    RunRow,
    SubmissionRow,
)
from episodic.storage.tx import idempotent, retry_outages

_items: Table = ItemRow.__table__  # type: ignore[assignment]
_subs: Table = SubmissionRow.__table__  # type: ignore[assignment]
_costs: Table = CostEntryRow.__table__  # type: ignore[assignment]
_media: Table = EpisodeMediaRow.__table__  # type: ignore[assignment]
_episodes: Table = EpisodeRow.__table__  # type: ignore[assignment]
_lost: Table = LostOutputRow.__table__  # type: ignore[assignment]
_runs: Table = RunRow.__table__  # type: ignore[assignment]
_members: Table = RunItemRow.__table__  # type: ignore[assignment]


def decided_refusal(episode_id: str, state: str) -> str:
    """Why images of a decided episode are not bought again, and what to run first."""
    return (
        f"episode {episode_id} is {state}: a re-bought image has other bytes than the ones "
        f"decided on; run `episodic reopen {episode_id} --by NAME --reason TEXT` first "
        "(nothing was bought)"
    )


@dataclass(frozen=True)
class RecordedImage:
    """A completed item's image as the ledger records it, with the paid call that made it:
    ``provider_profile`` and ``remote_ref`` (the provider's job, collected again for free),
    ``cost_micros`` in micro-units of ``currency``. ``key``/``size``/``media_type`` are None
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
    cost_micros: int
    currency: str
    submission_pk: int = 0  # the succeeded paid call
    position: int = 0  # the video's 1-based position in the playlist (what --only selects)
    idempotency_key: str = ""
    attempts: int = 0  # paid calls made for the item so far


@dataclass(frozen=True)
class Lost:
    """What `MediaRecords.lose` did: the items it sent back to pending (their outputs
    recorded lost), and whether the episode went from generated back to allocated."""

    item_pks: list[int]
    reopened_generated: bool


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
                    _costs.c.amount_micros,
                    _costs.c.currency,
                    _subs.c.id.label("submission_pk"),
                    _items.c.position,
                    _items.c.idempotency_key,
                    _items.c.attempts,
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
                cost_micros=row.amount_micros,
                currency=row.currency,
                submission_pk=row.submission_pk,
                position=row.position,
                idempotency_key=row.idempotency_key,
                attempts=row.attempts,
            )
            for row in rows
        ]

    @idempotent  # guarded: a second run after a lost COMMIT reply moves nothing again
    def lose(self, episode_pk: int, images: list[RecordedImage], reason: str) -> Lost:
        """`media restore --buy-again`: each of `images` (completed, its image missing from
        the store and not served by its provider) goes back to pending, to be bought again,
        and its loss is recorded in `lost_outputs` (which submission's output, its key,
        sha256, size and type, why, when); its paid call stays succeeded with its cost. One
        transaction, the episode's row first: a decided episode (approved, assembled,
        rejected) is refused (`CommandNotAllowed`: what was decided is what ships, and a
        new image needs a new decision, `episodic reopen`); a generated one goes back to
        allocated (generated again when the new images complete). Guarded per item by its
        recorded sha256: an item another process already sent back, or bought again, is
        left as it is (not in ``item_pks``)."""
        with tx.write(self.engine) as conn:
            query = select(_episodes.c.state, _episodes.c.episode_id).where(
                _episodes.c.id == episode_pk
            )
            if conn.dialect.name == "postgresql":
                query = query.with_for_update()
            state, episode_id = conn.execute(query).one()
            if state in DECIDED_STATES:
                raise CommandNotAllowed(decided_refusal(episode_id, state))
            now = utcnow()
            moved: list[int] = []
            for image in sorted(images, key=lambda found: found.item_pk):  # the lock order
                why = f"{reason} (job {image.remote_ref or 'none recorded'})"[:2000]
                params = {"b_item": image.item_pk, "b_sha": image.sha256, "b_reason": why}
                if not dbapi.rowcount(conn, statements.LOSE_OUTPUT, params):
                    continue
                conn.execute(
                    insert(_lost).values(
                        item_pk=image.item_pk,
                        submission_pk=image.submission_pk,
                        key=image.key,
                        sha256=image.sha256,
                        size=image.size,
                        media_type=image.media_type,
                        reason=why,
                        lost_at=now,
                    )
                )
                moved.append(image.item_pk)
            back = bool(moved) and move_episode(
                conn,
                episode_pk,
                EpisodeState.ALLOCATED,
                {"reason": "media restore --buy-again", "items": len(moved)},
                source=EpisodeState.GENERATED,
            )
            return Lost(moved, back)

    def lost_unfinished(self, episode_pk: int) -> list[tuple[str, int, int]]:
        """(item id, position, paid calls so far) of each of the episode's items whose output
        was recorded lost and that is not completed again yet (bought again by this or
        another process), in playlist order."""
        with tx.read(self.engine) as conn:
            rows = conn.execute(
                select(
                    _items.c.video_id,
                    _items.c.part,
                    _items.c.candidate,
                    _items.c.position,
                    _items.c.attempts,
                )
                .distinct()
                .join(_lost, _lost.c.item_pk == _items.c.id)
                .where(_items.c.episode_pk == episode_pk, _items.c.state != ItemState.COMPLETED)
                .order_by(_items.c.position, _items.c.part, _items.c.candidate)
            ).all()
        return [
            (item_label(row.video_id, row.part, row.candidate), row.position, row.attempts)
            for row in rows
        ]

    def dead_runs_buying_lost(self, episode_pk: int, fallback_lease_s: float) -> list[str]:
        """The episode's running runs that no process renews any more (their lease expired:
        `predicates.expired_run`, as the sweep judges them), created after the loss of an
        item they include was recorded, that item not completed again: a buy-again whose
        process died (never an older run that merely included the item once). Oldest
        first."""
        with tx.read(self.engine) as conn:
            rows = conn.execute(
                select(_runs.c.id, _runs.c.created_at)
                .distinct()
                .join(_members, _members.c.run_id == _runs.c.id)
                .join(_lost, _lost.c.item_pk == _members.c.item_pk)
                .join(_items, _items.c.id == _members.c.item_pk)
                .where(
                    _runs.c.episode_pk == episode_pk,
                    predicates.expired_run(utcnow(), fallback_lease_s),
                    _runs.c.created_at >= _lost.c.lost_at,
                    _items.c.state != ItemState.COMPLETED,
                )
                .order_by(_runs.c.created_at)
            ).all()
        return [str(row.id) for row in rows]

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
