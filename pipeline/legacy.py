"""Import episodes kept in the legacy weekly layout (docs/legacy-layout.md).

One folder per ISO week (``YYYY-Www``) with a ``state.json`` and its media files becomes the
versioned episode ``YYYY-Www-N`` (N: 0, or the next free sequence of that week), keeping the
provider task references, approval, cost records, completion times and media hashes, plus
migration metadata. Dry run by default; ``apply=True`` writes; a second apply changes nothing.
Every file is checked against its recorded sha256 before anything is written, and no
provider is ever built.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy import Engine, insert, select

from core.errors import InvalidInput
from core.ids import WeekId
from core.playlist import PlannedItem, canonical_json
from core.settings import Settings
from core.states import EpisodeState
from pipeline.allocation import allocate
from storage import tx
from storage.models import (
    ApprovalRow,
    CostEntryRow,
    EpisodeEventRow,
    EpisodeMediaRow,
    EpisodeRow,
    ItemRow,
    RunRow,
    SubmissionRow,
)
from storage.review import _move
from storage.runs import RunStore

TOOL_VERSION = "episodic-migrate-legacy/1"
_ID = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
_SHA = r"^[0-9a-f]{64}$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LegacyImage(_Strict):
    video_id: str = Field(pattern=_ID)
    part: int = Field(ge=1)
    file: str = Field(min_length=1)
    sha256: str = Field(pattern=_SHA)
    remote_ref: str = Field(min_length=1, max_length=256)
    cost_minor: int = Field(ge=0)
    currency: str = Field(default="USD", pattern="^[A-Z]{3}$")
    completed_at: datetime


class LegacyApproval(_Strict):
    state: Literal["pending", "approved", "rejected"]
    by: str | None = Field(default=None, max_length=100)
    at: datetime | None = None
    note: str | None = Field(default=None, max_length=2000)


class LegacyMedia(_Strict):
    file: str = Field(min_length=1)
    sha256: str = Field(pattern=_SHA)


class LegacyState(_Strict):
    schema_version: Literal[1] = Field(alias="schema")
    week_id: str
    completed_at: datetime | None = None
    approval: LegacyApproval
    images: list[LegacyImage] = Field(min_length=1)
    media: dict[Literal["cover"], LegacyMedia] = Field(default_factory=dict)


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
    return found


def _read_one(folder: Path) -> LegacyEpisode:
    path = folder / "state.json"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InvalidInput(f"{path}: missing") from None
    except OSError as exc:
        raise InvalidInput(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"{path}: not valid JSON ({exc})") from None
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
    file = (folder / name).resolve()
    if not file.is_relative_to(folder.resolve()) or not file.is_file():
        raise InvalidInput(f"{where}.file: {name!r} is not a file inside {folder}")
    if hashlib.sha256(file.read_bytes()).hexdigest() != sha256:
        raise InvalidInput(f"{where}.sha256: {name!r} does not match its recorded sha256")


def migrate(
    engine: Engine, settings: Settings, pipeline: str, root: Path, *, apply: bool
) -> list[dict[str, Any]]:
    """Dry run (default) or apply; returns one line of plan/result per legacy week."""
    episodes = read_layout(root)
    report = []
    for legacy in episodes:
        existing = _existing(engine, pipeline, legacy.allocation_key)
        cost = sum(i.cost_minor for i in legacy.state.images)
        line = {
            "legacy_id": legacy.legacy_id,
            "source": str(legacy.folder),
            "images": len(legacy.state.images),
            "cost_minor": cost,
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
        episode_id = _import(engine, settings, pipeline, legacy)
        report.append({**line, "episode_id": episode_id, "action": "imported"})
    return report


def _existing(engine: Engine, pipeline: str, key: str) -> str | None:
    """The episode a previous apply imported (its `migrated` event commits with the data)."""
    with tx.read(engine) as conn:
        return conn.execute(
            select(EpisodeRow.episode_id)
            .join(EpisodeEventRow, EpisodeEventRow.episode_pk == EpisodeRow.id)
            .where(
                EpisodeRow.pipeline == pipeline,
                EpisodeRow.allocation_key == key,
                EpisodeEventRow.kind == "migrated",
            )
        ).scalar()


def _next_id(engine: Engine, pipeline: str, week: str) -> str:
    from sqlalchemy import func

    with tx.read(engine) as conn:
        top = conn.execute(
            select(func.max(EpisodeRow.sequence)).where(
                EpisodeRow.pipeline == pipeline, EpisodeRow.week_id == week
            )
        ).scalar()
    return f"{week}-{0 if top is None else top + 1}"


def _import(engine: Engine, settings: Settings, pipeline: str, legacy: LegacyEpisode) -> str:
    allocation = allocate(engine, pipeline, WeekId.parse(legacy.legacy_id), legacy.allocation_key)
    episode_id = str(allocation.episode.episode_id)
    store = RunStore(engine)
    pk = store.episode_pk(pipeline, episode_id)
    out = settings.episode_folder(pipeline, episode_id)
    state = legacy.state
    items = [
        PlannedItem(
            n,
            i.video_id,
            i.part,
            f"(legacy {legacy.legacy_id})",
            0,
            hashlib.sha256(
                canonical_json(
                    {
                        "legacy": legacy.legacy_id,
                        "pipeline": pipeline,
                        "video": i.video_id,
                        "part": i.part,
                    }
                ).encode()
            ).hexdigest()[:32],
        )
        for n, i in enumerate(state.images, start=1)
    ]
    run_id = str(uuid.uuid4())
    now = datetime.now(UTC)
    # Everything below commits in one transaction: a crash leaves nothing half-imported, and
    # the next apply (which finds the same allocated episode) imports it whole.
    with tx.write(engine) as conn:
        conn.execute(
            insert(RunRow).values(
                id=run_id,
                episode_pk=pk,
                command="migrate",
                state="completed",
                params={"source": str(legacy.folder)},
                created_at=now,
                started_at=now,
                finished_at=state.completed_at or now,
            )
        )
        for planned, image in zip(items, state.images, strict=True):
            copy = out / "images" / f"{image.video_id}.p{image.part}{Path(image.file).suffix}"
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(legacy.folder / image.file, copy)
            item_pk = conn.execute(
                insert(ItemRow)
                .values(
                    episode_pk=pk,
                    run_id=run_id,
                    idempotency_key=planned.idempotency_key,
                    position=planned.index,
                    video_id=planned.video_id,
                    part=planned.part,
                    prompt=planned.prompt,
                    seed=0,
                    state="completed",
                    attempts=1,
                    output_path=str(copy),
                    output_sha256=image.sha256,
                    force_resubmit=False,
                    created_at=now,
                    started_at=image.completed_at,
                    finished_at=image.completed_at,
                )
                .returning(ItemRow.id)
            ).scalar_one()
            sub_pk = conn.execute(
                insert(SubmissionRow)
                .values(
                    item_pk=item_pk,
                    run_id=run_id,
                    attempt=1,
                    client_reference=f"{planned.idempotency_key}-1",
                    provider_profile="legacy",
                    state="succeeded",
                    remote_ref=image.remote_ref,
                    forced=False,
                    created_at=image.completed_at,
                    accepted_at=image.completed_at,
                    finished_at=image.completed_at,
                )
                .returning(SubmissionRow.id)
            ).scalar_one()
            conn.execute(
                insert(CostEntryRow).values(
                    episode_pk=pk,
                    submission_pk=sub_pk,
                    amount_minor=image.cost_minor,
                    currency=image.currency,
                    recorded_at=image.completed_at,
                )
            )
        for kind, media in state.media.items():
            copy = out / Path(media.file).name
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(legacy.folder / media.file, copy)
            conn.execute(
                insert(EpisodeMediaRow).values(
                    episode_pk=pk, kind=kind, path=str(copy), sha256=media.sha256, recorded_at=now
                )
            )
        conn.execute(
            insert(EpisodeEventRow).values(
                episode_pk=pk,
                kind="migrated",
                at=now,
                detail={
                    "source_path": str(legacy.folder),
                    "legacy_id": legacy.legacy_id,
                    "migrated_at": now.isoformat(),
                    "tool_version": TOOL_VERSION,
                    "legacy_completed_at": state.completed_at.isoformat()
                    if state.completed_at
                    else None,
                },
            )
        )
        _move(conn, pk, EpisodeState.GENERATED, {"migrated": True})
        if state.approval.state != "pending":
            approved = state.approval.state == "approved"
            target = EpisodeState.APPROVED if approved else EpisodeState.REJECTED
            by = state.approval.by or "legacy"
            _move(conn, pk, target, {"by": by, "note": state.approval.note, "migrated": True})
            conn.execute(
                insert(ApprovalRow).values(
                    episode_pk=pk,
                    decision=target.value,
                    decided_by=by,
                    note=state.approval.note,
                    decided_at=state.approval.at or now,
                )
            )
    return episode_id
