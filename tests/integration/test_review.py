"""Approval and assembly on SQLite and Postgres (DESIGN 7)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select

from core.errors import CommandNotAllowed, ImageNotAsPaid, InvalidInput
from core.settings import load_settings
from pipeline.approval import decide
from pipeline.assembly import assemble
from storage.models import (
    ApprovalRow,
    CostEntryRow,
    EpisodeEventRow,
    EpisodeMediaRow,
    ItemRow,
    SubmissionRow,
)
from tests.generation import Episode, new_episode, store_file, write_playlist

TABLES = (ApprovalRow, CostEntryRow, EpisodeEventRow, EpisodeMediaRow, ItemRow, SubmissionRow)


def snapshot(engine: Engine) -> dict[str, object]:
    with engine.connect() as conn:
        data: dict[str, object] = {
            t.__tablename__: conn.execute(select(func.count()).select_from(t)).scalar_one()
            for t in TABLES
        }
        data["media"] = conn.execute(
            select(
                EpisodeMediaRow.kind, EpisodeMediaRow.sha256, EpisodeMediaRow.recorded_at
            ).order_by(EpisodeMediaRow.kind)
        ).all()
    return data


@pytest.fixture
def generated(engine: Engine, database_url: str, tmp_path: Path) -> Episode:
    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "p", ["a", "b", "c"], parts={2: [1, 2]}))
    assert episode.generate().exit_code == 0
    return episode


def test_out_of_order_commands_are_refused(
    engine: Engine, database_url: str, tmp_path: Path
) -> None:
    episode = new_episode(engine)
    with pytest.raises(CommandNotAllowed, match="only a generated episode"):
        decide(engine, "weekly", episode.episode_id, approve=True, by="ann", note=None)
    with pytest.raises(CommandNotAllowed, match="only an approved episode"):
        assemble(engine, load_settings(), "weekly", episode.episode_id)
    episode.plan(write_playlist(tmp_path / "p", ["a"]))
    episode.generate()
    with pytest.raises(CommandNotAllowed, match="only an approved episode"):
        assemble(engine, load_settings(), "weekly", episode.episode_id)
    with pytest.raises(InvalidInput, match="--reason"):
        decide(engine, "weekly", episode.episode_id, approve=False, by="ann", note=None)
    with pytest.raises(InvalidInput, match="--by"):
        decide(engine, "weekly", episode.episode_id, approve=True, by=" ", note=None)


def test_approval_is_recorded_once_with_who(generated: Episode) -> None:
    first = decide(
        generated.engine, "weekly", generated.episode_id, approve=True, by="ann", note="ok"
    )
    again = decide(
        generated.engine, "weekly", generated.episode_id, approve=True, by="bob", note=None
    )
    assert first["changed"] and not again["changed"]
    with generated.engine.connect() as conn:
        rows = conn.execute(select(ApprovalRow.decision, ApprovalRow.decided_by)).all()
    assert [tuple(r) for r in rows] == [("approved", "ann")]
    with pytest.raises(CommandNotAllowed):
        decide(
            generated.engine, "weekly", generated.episode_id, approve=False, by="bob", note="late"
        )


def test_a_rejection_stands_through_a_generate_until_a_reopen(generated: Episode) -> None:
    """Issue 28: a generate with nothing to do moved a rejected episode back to `generated`,
    and the rejected images could then be approved without any re-plan."""
    from pipeline.approval import reopen
    from storage.episodes import EpisodeRepository

    engine, episode_id = generated.engine, generated.episode_id
    decide(engine, "weekly", episode_id, approve=False, by="ann", note="too dark")
    outcome = generated.generate()  # nothing to pay: the images are there
    assert outcome.counts.paid_submissions == 0 and outcome.exit_code == 0
    assert "stays rejected by ann" in outcome.message and "too dark" in outcome.message
    pk = EpisodeRepository(engine).episode_pk("weekly", episode_id)
    assert EpisodeRepository(engine).state(pk) == "rejected"
    with pytest.raises(CommandNotAllowed, match="was rejected by ann"):
        decide(engine, "weekly", episode_id, approve=True, by="bob", note=None)
    assert not decide(engine, "weekly", episode_id, approve=False, by="bob", note="again")[
        "changed"
    ]  # the same decision again: a no-op
    reopened = reopen(engine, "weekly", episode_id, by="cy", reason="second look")
    assert reopened["changed"] and reopened["from"] == "rejected"
    assert EpisodeRepository(engine).state(pk) == "allocated"
    assert generated.generate().counts.paid_submissions == 0
    assert EpisodeRepository(engine).state(pk) == "generated"
    assert decide(engine, "weekly", episode_id, approve=True, by="bob", note=None)["changed"]


def test_assembly_is_deterministic_and_reassembly_changes_nothing(generated: Episode) -> None:
    decide(generated.engine, "weekly", generated.episode_id, approve=True, by="ann", note=None)
    settings = load_settings()
    first = assemble(generated.engine, settings, "weekly", generated.episode_id)
    cover = Path(first["cover"]).read_bytes()
    manifest = Path(first["manifest"]).read_bytes()
    assert hashlib.sha256(cover).hexdigest() == first["cover_sha256"]
    assert first["images"] == 4
    before = snapshot(generated.engine)
    second = assemble(generated.engine, settings, "weekly", generated.episode_id)
    assert not second["changed"]
    assert not decide(
        generated.engine, "weekly", generated.episode_id, approve=True, by="ann", note=None
    )["changed"]  # approving an assembled episode again: a no-op
    assert Path(second["cover"]).read_bytes() == cover
    assert Path(second["manifest"]).read_bytes() == manifest
    assert snapshot(generated.engine) == before
    assert b'"remote_ref": "fake-' in manifest and b'"total_cost_minor": 16' in manifest


def test_assembly_refuses_images_that_are_not_what_was_paid_for(generated: Episode) -> None:
    decide(generated.engine, "weekly", generated.episode_id, approve=True, by="ann", note=None)
    with generated.engine.connect() as conn:
        path = store_file(conn.execute(select(ItemRow.output_key).limit(1)).scalar_one())
    path.write_bytes(b"tampered")
    with pytest.raises(ImageNotAsPaid, match=r"v0.* does not match the sha256 recorded"):
        assemble(generated.engine, load_settings(), "weekly", generated.episode_id)
    path.unlink()
    with pytest.raises(ImageNotAsPaid, match="missing"):
        assemble(generated.engine, load_settings(), "weekly", generated.episode_id)
