"""What was approved is what ships, on SQLite and Postgres.

Money is counted from the fake provider's own log (`jobs_per_key`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select

from episodic.core.errors import CommandNotAllowed
from episodic.core.settings import load_settings
from episodic.pipeline.approval import decide, reopen
from episodic.pipeline.assembly import assemble
from episodic.pipeline.check import check_episodes
from episodic.storage.models import EpisodePlanRow, EpisodeRow
from tests.generation import Episode, jobs_per_key, new_episode, stored_image, write_playlist


@pytest.fixture(autouse=True)
def fake_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))


def _state(episode: Episode) -> str:
    with episode.engine.connect() as conn:
        return str(conn.execute(select(EpisodeRow.state)).scalar_one())


def _approve(episode: Episode) -> None:
    decide(episode.engine, "weekly", episode.episode_id, approve=True, by="ann", note=None)


def _plan(episode: Episode, tmp_path: Path, name: str, titles: list[str]) -> Path:
    playlist = write_playlist(tmp_path / name, titles)
    episode.plan(playlist)
    return playlist


def test_an_approved_plan_is_frozen_until_reopened(engine: Engine, tmp_path: Path) -> None:
    episode = new_episode(engine)
    _plan(episode, tmp_path, "a", ["one", "two"])
    assert episode.generate().exit_code == 0
    _approve(episode)
    with pytest.raises(CommandNotAllowed, match="frozen"):
        _plan(episode, tmp_path, "b", ["one", "CHANGED"])
    assert len(jobs_per_key()) == 2  # nothing bought for the refused plan
    assembled = assemble(engine, load_settings(), "weekly", episode.episode_id)
    with pytest.raises(CommandNotAllowed, match="frozen"):
        _plan(episode, tmp_path, "b", ["one", "CHANGED"])
    reopened = reopen(engine, "weekly", episode.episode_id, by="bob", reason="typo in v02")
    assert reopened["from"] == "assembled" and _state(episode) == "allocated"
    _plan(episode, tmp_path, "b", ["one", "CHANGED"])
    with pytest.raises(CommandNotAllowed):  # not generated yet: nothing to approve
        _approve(episode)
    assert episode.generate().counts.paid_submissions == 1  # only the changed image
    _approve(episode)
    again = assemble(engine, load_settings(), "weekly", episode.episode_id)
    assert again["cover_sha256"] != assembled["cover_sha256"]
    manifest = json.loads(stored_image(again["manifest"]))
    assert {i["item_id"] for i in manifest["items"]} == {"v01.p1", "v02.p1"}
    with engine.connect() as conn:  # history keeps both plans
        assert conn.execute(select(func.count()).select_from(EpisodePlanRow)).scalar_one() == 2
    assert set(jobs_per_key().values()) == {1} and len(jobs_per_key()) == 3
    assert check_episodes(engine, "weekly") == []


def test_replanning_before_approval_needs_a_new_generation_and_going_back_pays_nothing(
    engine: Engine, tmp_path: Path
) -> None:
    """Plan A, generate, plan B, generate, plan A again: A's images are still A's (content-
    addressed files, never overwritten), nothing is paid again, and approval and assembly
    ship exactly A."""
    episode = new_episode(engine)
    plan_a = _plan(episode, tmp_path, "a", ["one", "two"])
    assert episode.generate().exit_code == 0
    assert _state(episode) == "generated"
    _plan(episode, tmp_path, "b", ["one", "CHANGED"])
    assert _state(episode) == "allocated"  # the reviewer would not see plan B's images
    with pytest.raises(CommandNotAllowed):
        _approve(episode)
    assert episode.generate().counts.paid_submissions == 1
    episode.plan(plan_a)
    outcome = episode.generate()
    assert outcome.run_id is None and outcome.exit_code == 0  # every image of A exists
    assert _state(episode) == "generated"
    _approve(episode)
    result = assemble(engine, load_settings(), "weekly", episode.episode_id)
    assert result["images"] == 2
    assert set(jobs_per_key().values()) == {1} and len(jobs_per_key()) == 3
    assert check_episodes(engine, "weekly") == []


def test_assembly_refuses_images_that_are_not_the_approved_ones(
    engine: Engine, tmp_path: Path
) -> None:
    """Whatever way the plan moved after approval (an older version, a hand-edited row),
    assembly compares with the approval record and ships nothing else."""
    from sqlalchemy import update

    from episodic.storage.models import ItemRow

    episode = new_episode(engine)
    _plan(episode, tmp_path, "a", ["one", "two"])
    assert episode.generate().exit_code == 0
    _approve(episode)
    from episodic.pipeline.media import prove_image
    from episodic.storage.media import MediaStore
    from tests.integration.test_media_store import image_bytes

    other = MediaStore.from_settings(load_settings()).put_image(prove_image(image_bytes()))
    with engine.begin() as conn:  # the ledger now claims another image (in the store) for one item
        first = conn.execute(select(ItemRow.id).order_by(ItemRow.id).limit(1)).scalar_one()
        conn.execute(
            update(ItemRow)
            .where(ItemRow.id == first)
            .values(output_key=other.key, output_sha256=other.sha256, output_size=other.size)
        )
    with pytest.raises(CommandNotAllowed, match="not the ones that were approved"):
        assemble(engine, load_settings(), "weekly", episode.episode_id)


def test_reopen_is_refused_unless_decided(engine: Engine, tmp_path: Path) -> None:
    from episodic.core.errors import InvalidInput

    episode = new_episode(engine)
    _plan(episode, tmp_path, "a", ["one"])
    with pytest.raises(CommandNotAllowed, match="only an approved, assembled or rejected"):
        reopen(engine, "weekly", episode.episode_id, by="bob", reason="why")
    assert episode.generate().exit_code == 0
    with pytest.raises(CommandNotAllowed, match="is generated"):  # not decided yet
        reopen(engine, "weekly", episode.episode_id, by="bob", reason="why")
    _approve(episode)
    with pytest.raises(InvalidInput, match="--reason"):
        reopen(engine, "weekly", episode.episode_id, by="bob", reason="  ")


# ---------------------------------------------------------------- a decision and its images
def test_a_decision_is_bound_to_the_images_that_were_shown(engine: Engine, tmp_path: Path) -> None:
    """Shown A, then someone re-plans and regenerates while the reviewer looks: approving
    with the digest of what was shown is refused; nothing is recorded."""
    from episodic.pipeline.approval import approval_digest, review_set

    episode = new_episode(engine)
    _plan(episode, tmp_path, "a", ["one", "two"])
    assert episode.generate().exit_code == 0
    shown = review_set(engine, "weekly", episode.episode_id)
    digest = approval_digest({o.idempotency_key: o.sha256 for o in shown})
    _plan(episode, tmp_path, "b", ["one", "CHANGED"])
    assert episode.generate().exit_code == 0 and _state(episode) == "generated"
    with pytest.raises(CommandNotAllowed, match="changed since they were shown"):
        decide(
            engine,
            "weekly",
            episode.episode_id,
            approve=True,
            by="ann",
            note=None,
            expected_digest=digest,
        )
    assert _state(episode) == "generated"
    now = review_set(engine, "weekly", episode.episode_id)
    assert [o.video_id for o in now] == ["v01", "v02"]  # the current plan only
    fresh = approval_digest({o.idempotency_key: o.sha256 for o in now})
    decide(
        engine,
        "weekly",
        episode.episode_id,
        approve=True,
        by="ann",
        note=None,
        expected_digest=fresh,
    )
    assert _state(episode) == "approved"


def test_a_reordered_plan_ships_in_its_own_order(engine: Engine, tmp_path: Path) -> None:
    episode = new_episode(engine)
    titles = ["one", "two", "three"]
    episode.plan(write_playlist(tmp_path / "a", titles, seeds=[1, 2, 3]))
    assert episode.generate().exit_code == 0
    reordered = write_playlist(tmp_path / "b", titles[::-1], seeds=[3, 2, 1])
    # same titles and seeds per video, in reverse order: video ids follow the position, so
    # this is a new plan; what matters is that assembly follows the plan's order
    episode.plan(reordered)
    episode.generate()
    _approve(episode)
    result = assemble(engine, load_settings(), "weekly", episode.episode_id)
    manifest = json.loads(stored_image(result["manifest"]))
    assert [i["item_id"] for i in manifest["items"]] == ["v01.p1", "v02.p1", "v03.p1"]


def test_check_reports_a_recorded_plan_todays_rules_refuse(engine: Engine, tmp_path: Path) -> None:
    from sqlalchemy import update

    episode = new_episode(engine)
    _plan(episode, tmp_path, "a", ["one"])
    assert episode.generate().exit_code == 0
    with engine.begin() as conn:  # as an older version, with looser rules, recorded it
        playlist = conn.execute(select(EpisodePlanRow.playlist)).scalar_one()
        playlist["items"][0]["title"] = "esc \x1b[2J"
        conn.execute(update(EpisodePlanRow).values(playlist=playlist))
    findings = check_episodes(engine, "weekly")
    assert [f.check for f in findings] == ["plan"] and "re-plan" in findings[0].detail


def test_a_run_of_an_older_plan_does_not_mark_a_replanned_episode_generated(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The episode is re-planned while a run of its previous plan is going: that run pays for
    # nothing more (the item in flight finishes; the rest of the old plan is never bought,
    # such as hero candidates a shrunk and approved plan no longer has) and is cancelled,
    # saying why; the episode stays allocated.
    import threading
    import time

    from episodic.storage.episodes import EpisodeRepository

    monkeypatch.setenv("EPISODIC_FAKE_DELAY_MS", "600")
    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "a", ["a1", "a2"]))
    outcomes: list[object] = []
    run = threading.Thread(target=lambda: outcomes.append(episode.generate(concurrency=1)))
    run.start()
    deadline = time.monotonic() + 30
    while not jobs_per_key() and time.monotonic() < deadline:
        time.sleep(0.02)
    episode.plan(write_playlist(tmp_path / "b", ["b1", "b2"], seeds=[7, 8]))  # while it runs
    run.join(timeout=60)
    (outcome,) = outcomes
    assert outcome.exit_code == 130, outcome.message  # type: ignore[attr-defined]
    assert outcome.state == "cancelled" and "re-planned" in outcome.message  # type: ignore[attr-defined]
    assert sum(jobs_per_key().values()) == 1  # the old plan's second image was never bought
    pk = EpisodeRepository(engine).episode_pk("weekly", episode.episode_id)
    with engine.connect() as conn:
        state = conn.execute(select(EpisodeRow.state).where(EpisodeRow.id == pk)).scalar_one()
    assert state == "allocated"
    assert check_episodes(engine, "weekly") == []
    again = episode.generate()  # the new plan's images, then generated
    assert again.exit_code == 0 and again.counts.paid_submissions == 2
    with engine.connect() as conn:
        state = conn.execute(select(EpisodeRow.state).where(EpisodeRow.id == pk)).scalar_one()
    assert state == "generated"
