"""Import episodes kept in the legacy weekly layout (docs/legacy-layout.md).

One folder per ISO week (``YYYY-Www``) with a ``state.json`` and its media files becomes the
versioned episode ``YYYY-Www-N`` (N: 0, or the next free sequence of that week), keeping the
provider task references, approval, cost records, completion times and media hashes, plus
migration metadata. Dry run by default; ``apply=True`` writes; a second apply changes nothing.
Every file is checked against its recorded sha256, and proven to be a PNG, JPEG or WEBP
image, before anything is written, and no provider is ever built. The files are copied
into the media store under their content keys (verified there), and the imported rows
record each key, sha256, size and media type, never a path.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from sqlalchemy import Engine

from episodic.core.documents import DocumentError, parse_json, read_text
from episodic.core.errors import InvalidInput, NotAnImage
from episodic.core.ids import WeekId
from episodic.core.media import StoredMedia
from episodic.core.money import MAX_IMAGE_COST_MICROS, MICROS_PER_MINOR, micros_from_minor
from episodic.core.playlist import (
    MAX_IMAGES_PER_PLAN,
    MAX_PART,
    PlannedItem,
    canonical_json,
    no_control_characters,
)
from episodic.core.settings import Settings
from episodic.core.states import EpisodeState
from episodic.pipeline.allocation import allocate
from episodic.pipeline.media import prove_image
from episodic.storage.episodes import EpisodeRepository
from episodic.storage.legacy import (
    ImportedDecision,
    ImportedEpisode,
    ImportedImage,
    imported_episode,
    known_remote_ref,
    record_import,
    top_sequence,
)
from episodic.storage.media import MediaStore

TOOL_VERSION = "episodic-migrate-legacy/1"
_ID = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
_SHA = r"^[0-9a-f]{64}$"
MAX_STATE_BYTES = 5_000_000
LEGACY_PROFILE = "legacy"  # the provider profile recorded on imported submissions


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# Text that is stored or shown: no control characters (Postgres cannot even store NUL); a
# file name is a relative path inside the week folder, at most 1024 characters, no NUL.
_Text = Annotated[str, AfterValidator(no_control_characters)]
_File = Annotated[str, Field(min_length=1, max_length=1024), AfterValidator(no_control_characters)]


class LegacyImage(_Strict):
    video_id: str = Field(pattern=_ID)
    part: int = Field(ge=1, le=MAX_PART, strict=True)  # `part: true` or `1.0` is refused
    file: _File
    sha256: str = Field(pattern=_SHA)
    remote_ref: _Text = Field(min_length=1, max_length=256)
    # whole minor units (cents), as the legacy layout records them; an int, in range
    cost_minor: int = Field(ge=0, le=MAX_IMAGE_COST_MICROS // MICROS_PER_MINOR, strict=True)
    currency: str = Field(default="USD", pattern="^[A-Z]{3}$")
    completed_at: AwareDatetime

    @property
    def cost_micros(self) -> int:
        return micros_from_minor(self.cost_minor)


class LegacyApproval(_Strict):
    state: Literal["pending", "approved", "rejected"]
    by: _Text | None = Field(default=None, min_length=1, max_length=100)
    at: AwareDatetime | None = None
    note: _Text | None = Field(default=None, max_length=2000)


class LegacyMedia(_Strict):
    file: _File
    sha256: str = Field(pattern=_SHA)


class LegacyState(_Strict):
    schema_version: Literal[1] = Field(alias="schema")
    week_id: str
    completed_at: AwareDatetime | None = None
    approval: LegacyApproval
    images: list[LegacyImage] = Field(min_length=1, max_length=MAX_IMAGES_PER_PLAN)
    media: dict[Literal["cover"], LegacyMedia] = Field(default_factory=dict)

    @field_validator("schema_version", mode="before")
    @classmethod
    def _integer_schema(cls, value: object) -> object:
        if isinstance(value, bool) or not isinstance(value, int):  # `true` or `1.0` is not 1
            raise ValueError("schema must be the integer 1")
        return value

    @model_validator(mode="after")
    def _one_image_per_part(self) -> LegacyState:
        seen: set[tuple[str, int]] = set()
        for n, image in enumerate(self.images):
            if (image.video_id, image.part) in seen:
                raise ValueError(
                    f"images.{n}: video {image.video_id} part {image.part} appears twice"
                )
            seen.add((image.video_id, image.part))
        return self


@dataclass(frozen=True, slots=True)
class LegacyEpisode:
    folder: Path
    legacy_id: str
    state: LegacyState

    @property
    def allocation_key(self) -> str:
        return f"legacy:{self.legacy_id}"


def read_layout(root: Path) -> list[LegacyEpisode]:
    """Parse and verify every week folder; any problem names the file and field."""
    try:
        root = root.resolve()
        if not root.is_dir():
            raise InvalidInput(f"{root} is not a folder")
        folders = sorted(p for p in root.iterdir() if p.is_dir())
    except OSError as exc:  # a name too long, a folder we may not read, ...
        raise InvalidInput(f"{root} cannot be read: {exc.strerror or exc}") from None
    found = []
    for folder in folders:
        try:
            WeekId.parse(folder.name)
        except InvalidInput:
            raise InvalidInput(f"{folder}: folder name is not an ISO week (YYYY-Www)") from None
        found.append(_read_one(folder))
    if not found:
        raise InvalidInput(f"{root} holds no week folders")
    owner: dict[str, str] = {}
    for legacy in found:  # one provider job is one paid image: never recorded twice
        for n, image in enumerate(legacy.state.images):
            first = owner.setdefault(image.remote_ref, f"{legacy.legacy_id} images.{n}")
            if first != f"{legacy.legacy_id} images.{n}":
                raise InvalidInput(
                    f"{legacy.folder / 'state.json'}: field images.{n}.remote_ref: "
                    f"{image.remote_ref!r} is also recorded by {first}"
                )
    return found


def _read_one(folder: Path) -> LegacyEpisode:
    path = folder / "state.json"
    try:
        raw = parse_json(read_text(path, max_bytes=MAX_STATE_BYTES))
    except DocumentError as exc:
        raise InvalidInput(f"{path}: {exc}") from None
    try:
        state = LegacyState.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise InvalidInput(f"{path}: field {where}: {first['msg']}") from None
    if state.week_id != folder.name:
        raise InvalidInput(f"{path}: field week_id: {state.week_id!r} differs from the folder")
    for n, image in enumerate(state.images):
        _verify(folder, image.file, image.sha256, f"{path}: field images.{n}")
    for kind, media in state.media.items():
        _verify(folder, media.file, media.sha256, f"{path}: field media.{kind}")
    return LegacyEpisode(folder, folder.name, state)


def _verify(folder: Path, name: str, sha256: str, where: str) -> None:
    outside = InvalidInput(f"{where}.file: {name!r} is not a file inside {folder}")
    try:
        file = (folder / name).resolve()  # symlinks resolved too
        if not file.is_relative_to(folder.resolve()) or not file.is_file():
            raise outside
        content = file.read_bytes()
    except (OSError, ValueError) as exc:  # a name too long, a NUL byte, unreadable
        if isinstance(exc, InvalidInput):
            raise
        raise outside from None
    if hashlib.sha256(content).hexdigest() != sha256:
        raise InvalidInput(f"{where}.sha256: {name!r} does not match its recorded sha256")
    try:  # every legacy file is an image (the parts' images, the cover): stored as one
        prove_image(content)
    except NotAnImage as exc:
        raise InvalidInput(f"{where}.file: {name!r} is {exc}") from None


def migrate(
    engine: Engine,
    settings: Settings,
    pipeline: str,
    root: Path,
    *,
    apply: bool,
    store: MediaStore | None = None,
) -> list[dict[str, Any]]:
    """Dry run (default) or apply; returns one line of plan/result per legacy week. The
    files are copied into `store` (default: the settings' media store)."""
    episodes = read_layout(root)
    _refuse_known_jobs(
        engine,
        [e for e in episodes if imported_episode(engine, pipeline, e.allocation_key) is None],
    )
    report = []
    for legacy in episodes:
        existing = imported_episode(engine, pipeline, legacy.allocation_key)
        cost = sum(i.cost_micros for i in legacy.state.images)
        line = {
            "legacy_id": legacy.legacy_id,
            "source": str(legacy.folder),
            "images": len(legacy.state.images),
            "cost_micros": cost,
            "approval": legacy.state.approval.state,
        }
        if existing is not None:
            report.append({**line, "episode_id": existing, "action": "already migrated"})
            continue
        if not apply:
            report.append(
                {
                    **line,
                    "episode_id": _next_id(engine, pipeline, legacy.legacy_id),
                    "action": "would import",
                }
            )
            continue
        if store is None:
            store = MediaStore.from_settings(settings)
        episode_id = _import(engine, store, pipeline, legacy)
        report.append({**line, "episode_id": episode_id, "action": "imported"})
    return report


def _refuse_known_jobs(engine: Engine, pending: list[LegacyEpisode]) -> None:
    """A remote reference some earlier import recorded (from another folder tree) is the same
    provider job: importing it again would record one paid image twice. Refused before
    anything is written."""
    refs = sorted({image.remote_ref for e in pending for image in e.state.images})
    for start in range(0, len(refs), 500):
        known = known_remote_ref(engine, LEGACY_PROFILE, refs[start : start + 500])
        if known is not None:
            raise InvalidInput(
                f"remote reference {known!r} is already recorded by an imported episode: "
                "the same provider job cannot be imported twice"
            )


def _next_id(engine: Engine, pipeline: str, week: str) -> str:
    top = top_sequence(engine, pipeline, week)
    return f"{week}-{0 if top is None else top + 1}"


def _copy_image(
    legacy: LegacyEpisode, pipeline: str, store: MediaStore, n: int, image: LegacyImage
) -> ImportedImage:
    """The `n`th legacy image, copied into the media `store`, as the import records it: a
    planned item whose key is derived from the legacy episode, video and part."""
    planned = PlannedItem(
        n,
        image.video_id,
        image.part,
        f"(legacy {legacy.legacy_id})",
        0,
        hashlib.sha256(
            canonical_json(
                {
                    "legacy": legacy.legacy_id,
                    "pipeline": pipeline,
                    "video": image.video_id,
                    "part": image.part,
                }
            ).encode()
        ).hexdigest()[:32],
    )
    return ImportedImage(
        planned,
        _store(store, legacy, image.file, image.sha256),
        image.remote_ref,
        image.cost_micros,
        image.currency,
        image.completed_at,
    )


def _store(store: MediaStore, legacy: LegacyEpisode, name: str, sha256: str) -> StoredMedia:
    """Copy the legacy file `name` into `store` (proven an image, verified there). Raises
    InvalidInput if it changed since the layout was read."""
    content = (legacy.folder / name).read_bytes()
    if hashlib.sha256(content).hexdigest() != sha256:
        raise InvalidInput(
            f"{legacy.folder / name}: changed while it was imported (no longer its recorded sha256)"
        )
    try:
        return store.put_image(prove_image(content))
    except NotAnImage as exc:
        raise InvalidInput(f"{legacy.folder / name} is {exc}") from None


def _import(engine: Engine, store: MediaStore, pipeline: str, legacy: LegacyEpisode) -> str:
    allocation = allocate(engine, pipeline, WeekId.parse(legacy.legacy_id), legacy.allocation_key)
    episode_id = str(allocation.episode.episode_id)
    pk = EpisodeRepository(engine).episode_pk(pipeline, episode_id)
    state = legacy.state
    now = datetime.now(UTC)
    images = [
        _copy_image(legacy, pipeline, store, n, image)
        for n, image in enumerate(state.images, start=1)
    ]
    media: list[tuple[str, StoredMedia]] = [
        (kind, _store(store, legacy, f.file, f.sha256)) for kind, f in state.media.items()
    ]
    decision = None
    if state.approval.state != "pending":
        decision = ImportedDecision(
            EpisodeState.APPROVED if state.approval.state == "approved" else EpisodeState.REJECTED,
            state.approval.by or "legacy",
            state.approval.note,
            state.approval.at or now,
        )
    record_import(  # the files are stored first: the records name objects that exist
        engine,
        ImportedEpisode(
            episode_pk=pk,
            run_id=str(uuid.uuid4()),
            source=str(legacy.folder),
            started_at=now,
            finished_at=state.completed_at or now,
            images=images,
            media=media,
            migrated={
                "source_path": str(legacy.folder),
                "legacy_id": legacy.legacy_id,
                "migrated_at": now.isoformat(),
                "tool_version": TOOL_VERSION,
                "legacy_completed_at": state.completed_at.isoformat()
                if state.completed_at
                else None,
            },
            decision=decision,
        ),
        LEGACY_PROFILE,
    )
    return episode_id
