"""Approval and assembly on SQLite and Postgres."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select

from episodic.core.errors import CommandNotAllowed, ImageNotAsPaid, InvalidInput
from episodic.core.settings import load_settings
from episodic.pipeline.approval import decide
from episodic.pipeline.assembly import assemble
from episodic.storage.media import MediaStore
from episodic.storage.models import (
    ApprovalRow,
    CostEntryRow,
    EpisodeEventRow,
    EpisodeMediaRow,
    ItemRow,
    SubmissionRow,
)
from tests.generation import Episode, new_episode, write_playlist
from tests.media_targets import MediaTarget

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
    """A generate with nothing to do leaves a rejected episode rejected (back at `generated`,
    the rejected images could be approved without any re-plan)."""
    from episodic.pipeline.approval import reopen
    from episodic.storage.episodes import EpisodeRepository

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
    store = MediaStore.from_settings(settings)
    first = assemble(generated.engine, settings, "weekly", generated.episode_id)
    cover = store.read(first["cover"])
    manifest = store.read(first["manifest"])
    assert hashlib.sha256(cover).hexdigest() == first["cover_sha256"]
    assert hashlib.sha256(manifest).hexdigest() == first["manifest_sha256"]
    assert first["images"] == 4
    before = snapshot(generated.engine)
    second = assemble(generated.engine, settings, "weekly", generated.episode_id)
    assert not second["changed"]
    assert not decide(
        generated.engine, "weekly", generated.episode_id, approve=True, by="ann", note=None
    )["changed"]  # approving an assembled episode again: a no-op
    assert (second["cover"], second["manifest"]) == (first["cover"], first["manifest"])
    assert store.read(second["cover"]) == cover and store.read(second["manifest"]) == manifest
    assert snapshot(generated.engine) == before
    assert b'"remote_ref": "fake-' in manifest and b'"total_cost_micros": 160000' in manifest


def test_the_manifest_names_each_image_by_its_store_key(generated: Episode) -> None:
    """No machine path in the manifest or the episode's media rows: every image and the
    cover by its store key, whose bytes are the recorded sha256 and size."""
    decide(generated.engine, "weekly", generated.episode_id, approve=True, by="ann", note=None)
    settings = load_settings()
    store = MediaStore.from_settings(settings)
    result = assemble(generated.engine, settings, "weekly", generated.episode_id)
    document = json.loads(store.read(result["manifest"]))
    assert document["cover"]["key"] == result["cover"]
    assert document["cover"]["media_type"] == "image/png"
    entries = [document["cover"], *document["items"]]
    assert len(entries) == 5
    for entry in entries:
        assert "path" not in entry and entry["key"].startswith("sha256/")
        content = store.read(entry["key"])
        assert hashlib.sha256(content).hexdigest() == entry["sha256"]
        assert len(content) == entry["size"]
    with generated.engine.connect() as conn:
        rows = conn.execute(
            select(EpisodeMediaRow.kind, EpisodeMediaRow.key, EpisodeMediaRow.path)
        ).all()
    assert sorted((kind, key) for kind, key, _ in rows) == [
        ("cover", result["cover"]),
        ("manifest", result["manifest"]),
    ]
    assert all(path is None for _, _, path in rows)
    assert str(settings.home_path) not in json.dumps(document)


def test_assemble_out_writes_a_local_copy_the_manifest_resolves_in(
    generated: Episode, tmp_path: Path
) -> None:
    decide(generated.engine, "weekly", generated.episode_id, approve=True, by="ann", note=None)
    out = tmp_path / "copy"
    result = assemble(generated.engine, load_settings(), "weekly", generated.episode_id, out=out)
    assert result["local"] == {
        "cover": str(out / "cover.png"),
        "manifest": str(out / "manifest.json"),
    }
    document = json.loads((out / "manifest.json").read_bytes())
    assert (
        hashlib.sha256((out / "manifest.json").read_bytes()).hexdigest()
        == result["manifest_sha256"]
    )
    assert hashlib.sha256((out / "cover.png").read_bytes()).hexdigest() == result["cover_sha256"]
    for entry in [document["cover"], *document["items"]]:
        assert hashlib.sha256((out / entry["key"]).read_bytes()).hexdigest() == entry["sha256"]


@pytest.fixture
def generated_in(media: MediaTarget, engine: Engine, tmp_path: Path) -> Episode:
    """A generated episode whose images are in `media` (a folder or a bucket)."""
    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "p", ["a", "b"]))
    assert episode.generate().exit_code == 0
    return episode


def _keys(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        keys = list(conn.execute(select(ItemRow.output_key).order_by(ItemRow.id)).scalars())
    assert keys and all(key and key.startswith("sha256/") for key in keys)
    return keys


def test_approval_and_assembly_refuse_images_that_are_not_what_was_paid_for(
    generated_in: Episode, media: MediaTarget
) -> None:
    """Tampered behind the store's back, then gone: nothing is decided or assembled, and
    the message names the key and the store."""
    engine, episode_id = generated_in.engine, generated_in.episode_id
    first = _keys(engine)[0]
    paid = media.read_behind(first)
    media.write_behind(first, b"tampered")
    with pytest.raises(ImageNotAsPaid, match=r"v0.* does not match the sha256 recorded"):
        decide(engine, "weekly", episode_id, approve=True, by="ann", note=None)
    media.write_behind(first, paid)
    decide(engine, "weekly", episode_id, approve=True, by="ann", note=None)
    media.write_behind(first, b"<html>error</html>")
    with pytest.raises(ImageNotAsPaid, match=r"does not match the sha256 recorded"):
        assemble(engine, load_settings(), "weekly", episode_id)
    media.delete_behind(first)
    with pytest.raises(ImageNotAsPaid, match=f"{first} in the media store .* is missing"):
        assemble(engine, load_settings(), "weekly", episode_id)
    media.write_behind(first, paid)
    assembled = assemble(engine, load_settings(), "weekly", episode_id)
    assert media.store().read(assembled["cover"])  # cover and manifest in the same store
    assert media.store().read(assembled["manifest"]).startswith(b"{")


def test_the_approval_form_shows_thumbnails_from_the_store_on_another_machine(
    generated_in: Episode, media: MediaTarget, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The form's previews are the store's bytes (checked against the sha256 paid for), so
    a form rendered by a worker with another state folder shows every image; an image gone
    from the store is named by its key, never shown from elsewhere."""
    from episodic.flows.approval.form import approval_form_description
    from episodic.pipeline.approval import approval_context

    monkeypatch.setenv("EPISODIC_HOME", str(tmp_path / "another-machine"))
    engine, episode_id = generated_in.engine, generated_in.episode_id
    context = approval_context(engine, "weekly", episode_id)
    outputs = context.review_set()
    markdown = approval_form_description(context, outputs)
    assert markdown.count("](data:image/jpeg;base64,") == 2, markdown
    first = _keys(engine)[0]
    media.delete_behind(first)
    with pytest.raises(ImageNotAsPaid, match="is missing"):
        context.review_set()
    markdown = approval_form_description(context, outputs)
    assert markdown.count("](data:image/jpeg;base64,") == 1
    assert f"`{first}`" in markdown


def test_reopen_names_the_images_the_store_no_longer_holds(
    generated_in: Episode, media: MediaTarget
) -> None:
    """After reopen a generate pays nothing for completed images, so one lost from the
    store would only surface at the next approval: reopen names it."""
    from episodic.pipeline.approval import reopen

    engine, episode_id = generated_in.engine, generated_in.episode_id
    decide(engine, "weekly", episode_id, approve=True, by="ann", note=None)
    first = _keys(engine)[0]
    media.delete_behind(first)
    reopened = reopen(engine, "weekly", episode_id, by="ann", reason="lost one")
    assert reopened["changed"] and reopened["missing"] == ["v01.p1"]
