"""An episode's recorded media as people see them: `episodes show` lists each completed
image, the cover and the manifest by its media store key and whether the store holds it;
`open_store` (`writable_store`: proven writable) and `preview_bytes` give commands and the
flows' artifacts the store (flows reach storage only through the pipeline).

Presence only (one metadata request per object): `episodic check` is what reads every
object in full and compares it with its recorded sha256.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from episodic.core.errors import (
    CommandNotAllowed,
    InvalidInput,
    MediaStoreError,
    MediaStoreUnavailable,
)
from episodic.core.settings import Settings
from episodic.storage.episodes import EpisodeRepository
from episodic.storage.ledger import completed_outputs
from episodic.storage.media import MediaStore
from episodic.storage.store_identity import verify


def open_store(
    settings: Settings, engine: Engine, *, adopt: bool = False, read_only: bool = False
) -> MediaStore:
    """The media store `settings` name (EPISODIC_MEDIA_URL), opened once per command or
    flow step. Refused (`MediaStoreMisconfigured`, exit 2, one line) when it is a local
    folder that does not exist (a wrong folder is not a store that lost every image), and
    (`WrongMediaStore`) unless it is the store the database records (``adopt``: a step that
    writes media records it when none is; ``read_only``: a command that only reads and
    reports goes on at the recorded address whose marker is missing;
    `episodic.storage.store_identity`)."""
    store = MediaStore.from_settings(settings)
    store.check_root()
    verify(engine, store, adopt=adopt, read_only=read_only)
    return store


def writable_store(settings: Settings, engine: Engine) -> MediaStore:
    """The media store `settings` names, proven writable (`MediaStore.probe`: a small object
    written, read back and deleted) and the database's own (`store_identity.verify`,
    adopting it if none is recorded) before anything is spent: a paid image that cannot be
    kept must not be bought. Raises `MediaStoreMisconfigured` (no such bucket or folder,
    access denied, wrong credentials; `WrongMediaStore`) or `CommandNotAllowed` (the store
    does not answer now), exit 2, one line naming the store (`describe()`), never a
    credential."""
    store = MediaStore.from_settings(settings)
    store.check_root()
    try:
        store.probe()
        verify(engine, store, adopt=True)
    except MediaStoreUnavailable as exc:
        raise CommandNotAllowed(
            f"{exc}; nothing was spent: try again when the media store answers"
        ) from None
    return store


def preview_bytes(store: MediaStore, key: str) -> bytes | None:
    """The bytes under `key` for a preview; None when the store does not hold them or
    cannot answer (a preview is never worth failing a step)."""
    try:
        return store.read(key)
    except (MediaStoreError, InvalidInput):
        return None


def episode_media(engine: Engine, store: MediaStore, episode_pk: int) -> list[dict[str, Any]]:
    """One entry per completed image (playlist order), then cover and manifest: ``name``
    (an item id such as ``v01.p1``, or the medium's kind), ``key`` (None for a row from
    before the store), ``legacy_path`` (such a row's local file), ``sha256``, ``size``
    (bytes, None when not recorded), ``media_type`` and ``stored``: ``yes``, ``missing``,
    or ``unknown`` when the store cannot answer (an outage is not a finding)."""
    rows: list[dict[str, Any]] = [
        {
            "name": image.item_id,
            "key": image.key,
            "legacy_path": image.legacy_path,
            "sha256": image.sha256,
            "size": image.size,
            "media_type": image.media_type,
        }
        for image in completed_outputs(engine, episode_pk)
    ]
    rows += [
        {
            "name": kind,
            "key": medium.key,
            "legacy_path": medium.legacy_path,
            "sha256": medium.sha256,
            "size": medium.size,
            "media_type": medium.media_type,
        }
        for kind, medium in sorted(EpisodeRepository(engine).media(episode_pk).items())
    ]
    for row in rows:
        row["stored"] = _stored(store, row["key"], row["legacy_path"])
    return rows


def _stored(store: MediaStore, key: str | None, legacy_path: str | None) -> str:
    if key is None:  # from before the store: its local file, on this machine only
        return "yes (local file)" if legacy_path and Path(legacy_path).is_file() else "missing"
    try:
        return "yes" if store.exists(key) else "missing"
    except MediaStoreError:
        return "unknown"
