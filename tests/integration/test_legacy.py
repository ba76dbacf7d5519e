"""Legacy migration on SQLite and Postgres (examples/legacy is the fixture)."""

from __future__ import annotations

import hashlib
import json
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select

from episodic.core.errors import InvalidInput
from episodic.core.ids import EpisodeId, WeekId
from episodic.core.settings import load_settings
from episodic.pipeline.allocation import allocate
from episodic.pipeline.check import check_episodes
from episodic.pipeline.legacy import TOOL_VERSION, migrate
from episodic.storage.episodes import EpisodeRepository
from episodic.storage.installation import installation_id
from episodic.storage.models import (
    ApprovalRow,
    CostEntryRow,
    EpisodeEventRow,
    EpisodeMediaRow,
    EpisodeRow,
    ItemRow,
    RunRow,
    SubmissionRow,
)
from tests.media_targets import MediaTarget

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "legacy"
TABLES = (
    ApprovalRow,
    CostEntryRow,
    EpisodeEventRow,
    EpisodeMediaRow,
    EpisodeRow,
    ItemRow,
    RunRow,
    SubmissionRow,
)


@pytest.fixture
def layout(tmp_path: Path) -> Path:
    copy = tmp_path / "legacy"
    shutil.copytree(EXAMPLE, copy)
    return copy


def counts(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {
            t.__tablename__: conn.execute(select(func.count()).select_from(t)).scalar_one()
            for t in TABLES
        }


def home_files() -> list[Path]:
    home = load_settings().home_path
    return sorted(p for p in home.rglob("*") if p.is_file() and "episodic.db" not in p.name)


def test_dry_run_writes_nothing(engine: Engine, layout: Path) -> None:
    before, files = counts(engine), home_files()
    report = migrate(engine, load_settings(), "weekly", layout, apply=False)
    assert [(r["legacy_id"], r["episode_id"], r["action"]) for r in report] == [
        ("2026-W30", "2026-W30-0", "would import"),
        ("2026-W31", "2026-W31-0", "would import"),
    ]
    assert counts(engine) == before and home_files() == files


def test_apply_keeps_every_field_and_hash_and_a_second_apply_is_a_no_op(
    engine: Engine,
    layout: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    media: MediaTarget,
) -> None:
    """The files are copied into the media store (a folder, a bucket), each under its
    content key with its sha256, size and media type; no row names a path."""
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))
    report = migrate(engine, load_settings(), "weekly", layout, apply=True)
    assert [r["action"] for r in report] == ["imported", "imported"]
    state = json.loads((layout / "2026-W30" / "state.json").read_text())
    with engine.connect() as conn:
        rows = conn.execute(
            select(
                ItemRow.video_id,
                ItemRow.output_key,
                ItemRow.output_path,
                ItemRow.output_sha256,
                ItemRow.output_size,
                ItemRow.output_media_type,
                ItemRow.finished_at,
                SubmissionRow.remote_ref,
                CostEntryRow.amount_micros,
            )
            .join(SubmissionRow, SubmissionRow.item_pk == ItemRow.id)
            .join(CostEntryRow, CostEntryRow.submission_pk == SubmissionRow.id)
            .join(EpisodeRow, EpisodeRow.id == ItemRow.episode_pk)
            .where(EpisodeRow.episode_id == "2026-W30-0")
            .order_by(ItemRow.position)
        ).all()
        approval = conn.execute(
            select(ApprovalRow.decided_by, ApprovalRow.decided_at, ApprovalRow.note)
        ).one()
        cover = conn.execute(
            select(
                EpisodeMediaRow.key,
                EpisodeMediaRow.path,
                EpisodeMediaRow.sha256,
                EpisodeMediaRow.size,
                EpisodeMediaRow.media_type,
            )
            .join(EpisodeRow, EpisodeRow.id == EpisodeMediaRow.episode_pk)
            .where(EpisodeRow.episode_id == "2026-W30-0")
        ).one()
    for row, image in zip(rows, state["images"], strict=True):
        assert row.video_id == image["video_id"] and row.remote_ref == image["remote_ref"]
        assert (
            row.output_sha256 == image["sha256"]
            and row.amount_micros == image["cost_minor"] * 10_000
        )
        held = media.read_behind(row.output_key)  # what the store holds, read around it
        assert row.output_path is None and row.output_key.startswith("sha256/")
        assert hashlib.sha256(held).hexdigest() == image["sha256"] == row.output_sha256
        assert (row.output_size, row.output_media_type) == (len(held), "image/png")
        assert row.finished_at == datetime(2026, 7, 20, 9, 30, tzinfo=UTC)
    assert tuple(approval) == ("ann", datetime(2026, 7, 21, 10, tzinfo=UTC), "ok")
    assert cover.sha256 == state["media"]["cover"]["sha256"]
    assert cover.path is None and cover.media_type == "image/png"
    assert hashlib.sha256(media.read_behind(cover.key)).hexdigest() == cover.sha256
    assert cover.size == len(media.read_behind(cover.key))
    repository = EpisodeRepository(engine)
    assert [e.state for e in repository.list("weekly")] == ["approved", "generated"]
    history = repository.history("weekly", EpisodeId.parse("2026-W30-0"))
    (migrated,) = [e for e in history if e.kind == "migrated"]
    assert migrated.detail["legacy_id"] == "2026-W30"
    assert migrated.detail["source_path"] == str((layout / "2026-W30").resolve())
    assert migrated.detail["tool_version"] == TOOL_VERSION and migrated.detail["migrated_at"]
    assert check_episodes(engine, "weekly") == []
    assert not (tmp_path / "provider.jsonl").exists()  # no provider was built
    with engine.connect() as conn:  # references in this installation's one form
        references = conn.execute(select(SubmissionRow.client_reference)).scalars().all()
    scope = installation_id(engine)
    assert references and all(ref.startswith(f"{scope}-") for ref in references)

    before, files = counts(engine), home_files()
    again = migrate(engine, load_settings(), "weekly", layout, apply=True)
    assert [r["action"] for r in again] == ["already migrated", "already migrated"]
    assert counts(engine) == before and home_files() == files


def test_a_week_with_episodes_gets_the_next_sequence(engine: Engine, layout: Path) -> None:
    allocate(engine, "weekly", WeekId.parse("2026-W31"), "already-there")
    report = migrate(engine, load_settings(), "weekly", layout, apply=True)
    assert [r["episode_id"] for r in report] == ["2026-W30-0", "2026-W31-1"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s["images"][0].update(sha256="0" * 64), "images.0.sha256"),
        (lambda s: s["images"][1].pop("remote_ref"), "images.1.remote_ref"),
        (lambda s: s["approval"].update(state="maybe"), "approval.state"),
        (lambda s: s.update(week_id="2026-W29"), "week_id"),
        (lambda s: s["images"][0].update(file="../../../etc/passwd"), "images.0.file"),
    ],
)
def test_a_malformed_state_json_is_refused_naming_file_and_field(
    engine: Engine,
    layout: Path,
    change,
    message: str,  # type: ignore[no-untyped-def]
) -> None:
    path = layout / "2026-W31" / "state.json"
    state = json.loads(path.read_text())
    change(state)
    path.write_text(json.dumps(state))
    before, files = counts(engine), home_files()
    with pytest.raises(InvalidInput) as refused:
        migrate(engine, load_settings(), "weekly", layout, apply=True)
    assert str(path) in str(refused.value) and message in str(refused.value)
    assert counts(engine) == before and home_files() == files


@pytest.mark.parametrize(
    "body",
    [b"<!doctype html><html><body>Not Found</body></html>", b"\x89PNG\r\n\x1a\n cut short"],
)
def test_a_legacy_file_that_is_not_an_image_is_refused_before_anything_is_written(
    engine: Engine, layout: Path, body: bytes
) -> None:
    """The store keeps only proven images: a legacy image (or cover) that does not decode is
    refused, naming the file and field, and nothing is written or stored."""
    path = layout / "2026-W31" / "state.json"
    state = json.loads(path.read_text())
    (layout / "2026-W31" / state["images"][1]["file"]).write_bytes(body)
    state["images"][1]["sha256"] = hashlib.sha256(body).hexdigest()
    path.write_text(json.dumps(state))
    before, files = counts(engine), home_files()
    with pytest.raises(InvalidInput, match=r"images\.1\.file: .* is not an image") as refused:
        migrate(engine, load_settings(), "weekly", layout, apply=True)
    assert str(path) in str(refused.value)
    assert counts(engine) == before and home_files() == files
