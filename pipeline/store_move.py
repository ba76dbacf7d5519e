"""`episodic media import --from URL`: move to another media store on purpose.

The database records the store it writes to (storage.store_identity); every command refuses
another one. To move, configure the new store (EPISODIC_MEDIA_URL) and name the recorded one
with ``--from``: every object the database records (completed images, covers, manifests) is
read from the old store, checked against its recorded sha256, written to the new one
(put-if-absent, verified there), and only when every one of them is there does the database
record the new store (guarded by the old store's id). A copy that fails leaves the old store
recorded: run it again (objects already copied are kept as they are). Pays nothing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Literal

from sqlalchemy import Engine

from episodic.core.errors import (
    CommandNotAllowed,
    MediaMissing,
    MediaStoreError,
    MediaStoreUnavailable,
    NotAnImage,
)
from episodic.core.media import DOCUMENT_TYPES
from episodic.core.settings import Settings
from episodic.pipeline.media import prove_image
from episodic.storage import store_identity
from episodic.storage.media import MediaStore

CopyStatus = Literal["copied", "missing", "differs", "store_failed"]


@dataclass(frozen=True)
class CopiedObject:
    key: str
    status: CopyStatus
    detail: str = ""


@dataclass
class MoveReport:
    source: str
    store: str
    objects: list[CopiedObject] = field(default_factory=list)
    moved: bool = False

    @property
    def complete(self) -> bool:
        return self.moved

    def counts(self) -> dict[str, int]:
        found: dict[str, int] = {}
        for o in self.objects:
            found[o.status] = found.get(o.status, 0) + 1
        return found

    def to_dict(self) -> dict[str, object]:
        return {
            "source": self.source,
            "store": self.store,
            "moved": self.moved,
            "counts": self.counts(),
            "objects": [asdict(o) for o in self.objects],
        }


def move_store(
    engine: Engine,
    settings: Settings,
    source_url: str,
    *,
    on_plan: Callable[[int], None] | None = None,
    on_object: Callable[[CopiedObject], None] | None = None,
) -> MoveReport:
    """Copy every recorded object from the recorded store `source_url` to the configured
    store, then record the configured one (module docstring). Refused (exit 2) before
    anything is written when nothing is recorded, `source_url` is not the recorded store
    (`WrongMediaStore`), or the configured store cannot be written."""
    have = store_identity.recorded(engine)
    if have is None:
        raise CommandNotAllowed(
            "no media store is recorded yet: there is nothing to move from (the next "
            "command that writes media records the configured store)"
        )
    source = MediaStore.open(source_url)
    store_identity.verify(engine, source, adopt=False)
    target = MediaStore.from_settings(settings)
    try:
        target.probe()
    except MediaStoreUnavailable as exc:
        raise CommandNotAllowed(f"{exc}; nothing was moved: try again later") from None
    report = MoveReport(source.describe(), target.describe())
    if store_identity.marker_id(target) == have.store_id:
        raise CommandNotAllowed(
            f"media store {target.describe()} is already the recorded store: nothing to move"
        )
    objects = store_identity.recorded_objects(engine)
    if on_plan is not None:
        on_plan(len(objects))
    for key, sha256, media_type in objects:
        done = _copy(source, target, key, sha256, media_type)
        report.objects.append(done)
        if on_object is not None:
            on_object(done)
    if all(o.status == "copied" for o in report.objects):
        store_identity.move(engine, have, target)
        report.moved = True
    return report


def _copy(source: MediaStore, target: MediaStore, key: str, sha256: str, kind: str) -> CopiedObject:
    try:
        content = source.read(key)
    except MediaMissing:
        return CopiedObject(key, "missing", f"missing from {source.describe()}")
    except MediaStoreError as exc:
        return CopiedObject(key, "store_failed", str(exc))
    if hashlib.sha256(content).hexdigest() != sha256:
        return CopiedObject(key, "differs", "its bytes are not the recorded sha256: not copied")
    try:
        if kind in DOCUMENT_TYPES:
            stored = target.put_document(content, media_type=kind, repair=True)
        else:
            stored = target.put_image(prove_image(content), repair=True)
    except NotAnImage as exc:
        return CopiedObject(key, "differs", f"not an image: {exc.reason}")
    except MediaStoreError as exc:
        return CopiedObject(key, "store_failed", str(exc))
    if stored.key != key:
        return CopiedObject(key, "differs", f"stored as {stored.key}, not its recorded key")
    return CopiedObject(key, "copied")
