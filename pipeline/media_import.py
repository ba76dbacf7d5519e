"""`episodic media import`: rows written before the media store become keys.

Before the store, a completed item recorded its image as an absolute path on the machine
that paid for it (``items.output_path``), and an assembled episode its cover and manifest
(``episode_media.path``). The import reads each such file, checks its sha256 against the
recorded one (the evidence of what was paid for), proves an image is an image, puts the
bytes in the configured store under their content key (verified there), and only then
records the key, size and media type and clears the legacy path, in one guarded write per
row. It pays nothing and builds no provider.

Per file (`ImportedFile.status`): **imported**; **missing** (no such file on this machine:
reported, not fatal; `episodic media restore` collects an image again from its provider);
**differs** (the file is not the recorded bytes: left as it is, never stored as that row's
image); **not_an_image**; **store_failed**. A second run finds no legacy rows and does
nothing; the legacy files themselves are never deleted.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from sqlalchemy import Engine

from episodic.core.errors import MediaStoreError, NotAnImage
from episodic.core.media import StoredMedia
from episodic.core.settings import Settings
from episodic.pipeline.media import prove_image
from episodic.pipeline.media_view import writable_store
from episodic.storage.media import MediaStore
from episodic.storage.media_records import LegacyFile, MediaRecords

ImportStatus = Literal["imported", "missing", "differs", "not_an_image", "store_failed"]
MAX_LEGACY_BYTES = 64 * 1024 * 1024  # an image or manifest; anything larger is not ours


@dataclass(frozen=True)
class ImportedFile:
    """One legacy row's file: where it was, what happened, its key once imported."""

    pipeline: str
    episode_id: str
    what: str  # "image v01.p1", "cover", "manifest"
    path: str
    status: ImportStatus
    key: str | None = None
    detail: str = ""


@dataclass
class ImportReport:
    store: str
    files: list[ImportedFile] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Every legacy file was imported (or there was none)."""
        return all(f.status == "imported" for f in self.files)

    def counts(self) -> dict[str, int]:
        found: dict[str, int] = {}
        for f in self.files:
            found[f.status] = found.get(f.status, 0) + 1
        return found

    def to_dict(self) -> dict[str, object]:
        return {
            "store": self.store,
            "complete": self.complete,
            "counts": self.counts(),
            "files": [asdict(f) for f in self.files],
        }


def import_legacy_media(
    engine: Engine,
    settings: Settings,
    *,
    on_plan: Callable[[int], None] | None = None,
    on_file: Callable[[ImportedFile], None] | None = None,
) -> ImportReport:
    """Copy every legacy file the database names into the store named by `settings`
    (module docstring). Errors before anything is written: `MediaStoreMisconfigured` /
    `CommandNotAllowed` (the store cannot be written, exit 2)."""
    store = writable_store(settings, engine)
    records = MediaRecords(engine)
    legacy = records.legacy_files()
    if on_plan is not None:
        on_plan(len(legacy))
    report = ImportReport(store.describe())
    for row in legacy:
        done = _import_one(store, records, row)
        report.files.append(done)
        if on_file is not None:
            on_file(done)
    return report


def _import_one(store: MediaStore, records: MediaRecords, row: LegacyFile) -> ImportedFile:
    def answer(status: ImportStatus, key: str | None = None, detail: str = "") -> ImportedFile:
        return ImportedFile(row.pipeline, row.episode_id, row.label, row.path, status, key, detail)

    path = Path(row.path)
    try:
        if path.stat().st_size > MAX_LEGACY_BYTES:
            return answer("differs", detail=f"larger than {MAX_LEGACY_BYTES} bytes")
        content = path.read_bytes()
    except FileNotFoundError:
        return answer("missing", detail="no such file on this machine")
    except OSError as exc:
        return answer("missing", detail=f"cannot read it: {exc.strerror or type(exc).__name__}")
    sha256 = hashlib.sha256(content).hexdigest()
    if sha256 != row.sha256:
        return answer(
            "differs",
            detail=f"its sha256 {sha256[:12]}… is not the recorded {row.sha256[:12]}…: "
            "left as it is",
        )
    try:
        stored = _put(store, row, content)
    except NotAnImage as exc:
        return answer("not_an_image", detail=exc.reason)
    except MediaStoreError as exc:
        return answer("store_failed", detail=str(exc))
    if not records.record_imported(row, stored):
        return answer("differs", stored.key, "the row changed meanwhile; it names another key")
    return answer("imported", stored.key)


def _put(store: MediaStore, row: LegacyFile, content: bytes) -> StoredMedia:
    if row.kind == "manifest":
        return store.put_document(content, media_type="application/json", repair=True)
    return store.put_image(prove_image(content), repair=True)
