"""Hero runs on the Prefect path: the weekly slot run generates every candidate,
suspends at a form that shows each hero video's candidates and asks for the pick, and ships
exactly the picked candidate. Presence and range of a pick are checked by the Prefect server
before the run resumes (schema constraints), so a bad pick never resumes the run."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from prefect.client.schemas.responses import SetStateStatus

from episodic.flows import local
from episodic.flows.weekly import weekly_episode
from episodic.storage.approvals import ApprovalStore
from episodic.storage.engine import make_engine
from episodic.storage.episodes import EpisodeRepository
from tests.flows.test_prefect_path import MONDAY, _deploy, _episode_state, _form, _resume
from tests.generation import jobs_per_key, stored_image, write_playlist

pytestmark = pytest.mark.slow
# The form and the server's checks do not depend on the project's database: those tests run
# on SQLite; what records and ships the picks runs on both backends.
FORM_ONLY = pytest.mark.parametrize("backend", ["sqlite"])


@pytest.fixture
def hero_waiting(harness: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A weekly slot run suspended at its approval form: v01 has 3 hero candidates, v02 is a
    plain image, v03 has 2 candidates (6 paid images)."""
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))
    playlist = write_playlist(tmp_path / "pl", ["a", "b", "c"], hero={1: 3, 3: 2})
    deployment = _deploy(playlist)
    (run,) = local.schedule_slots(deployment, MONDAY, MONDAY + timedelta(days=7, seconds=-1))
    state = local.execute(weekly_episode, run.id)
    assert state.is_paused(), state
    return run


@FORM_ONLY
def test_the_form_shows_each_candidate_and_asks_for_each_pick(
    harness: str, hero_waiting: Any
) -> None:
    schema, description = _form(hero_waiting.id)
    assert set(schema["required"]) == {"decision", "reviewer", "pick_1", "pick_2"}
    pick_1, pick_2 = schema["properties"]["pick_1"], schema["properties"]["pick_2"]
    assert (pick_1["type"], pick_1["minimum"], pick_1["maximum"]) == ("integer", 1, 3)
    assert (pick_2["minimum"], pick_2["maximum"]) == (1, 2)
    assert pick_1["title"] == "v01: the candidate that ships"
    assert "### a `v01`: pick one of 3 candidates" in description  # its title, then its id
    assert "### c `v03`: pick one of 2 candidates" in description
    assert description.count("](data:image/jpeg;base64,") == 6  # every candidate and v02
    for label in ("v01.c1", "v01.c2", "v01.c3", "v03.c1", "v03.c2"):
        assert f"| candidate {label[-1]} | ![{label}](data:image/jpeg;base64," in description
    assert "### b `v02`\n" in description and "| part 1 | ![v02.p1](" in description


@FORM_ONLY
def test_a_missing_or_out_of_range_pick_is_refused_before_the_run_resumes(
    harness: str, hero_waiting: Any
) -> None:
    base = {"decision": "approve", "reviewer": "ann"}
    for bad in (
        base,
        {**base, "pick_1": 2},
        {**base, "pick_1": 4, "pick_2": 1},
        {**base, "pick_1": 0, "pick_2": 1},
        {**base, "pick_1": 2, "pick_2": 3},
        {**base, "pick_1": "2", "pick_2": 1},
    ):
        assert _resume(hero_waiting.id, bad) != SetStateStatus.ACCEPT, bad
        _form(hero_waiting.id)  # still paused at the same form
    assert _episode_state(harness) == "generated"


def test_the_picked_candidates_ship_and_nothing_is_paid_again(
    harness: str, hero_waiting: Any
) -> None:
    paid = jobs_per_key()
    assert len(paid) == 6 and set(paid.values()) == {1}
    answer = {"decision": "approve", "reviewer": "ann", "pick_1": 3, "pick_2": 1}
    assert _resume(hero_waiting.id, answer) == SetStateStatus.ACCEPT
    state = local.execute(weekly_episode, hero_waiting.id)
    assert state.is_completed(), state
    assert _episode_state(harness) == "assembled"
    assert jobs_per_key() == paid  # the resumed run paid nothing
    engine = make_engine(harness)
    try:
        pk = EpisodeRepository(engine).episode_pk("weekly", "2026-W32-0")
        review = ApprovalStore(engine)
        episodes = EpisodeRepository(engine)
        assert review.approved_picks(pk) == {"v01": 3, "v03": 1}
        manifest_key = episodes.media(pk)["manifest"].key
    finally:
        engine.dispose()
    manifest = json.loads(stored_image(str(manifest_key)))
    assert [i["item_id"] for i in manifest["items"]] == ["v01.c3", "v02.p1", "v03.c1"]
    assert [(h["video_id"], h["picked"], len(h["candidates"])) for h in manifest["heroes"]] == [
        ("v01", 3, 3),
        ("v03", 1, 2),
    ]


@FORM_ONLY
def test_a_rejection_needs_picks_in_the_form_but_records_none(
    harness: str, hero_waiting: Any
) -> None:
    answer = {"decision": "reject", "reviewer": "bob", "note": "too dark", "pick_1": 1, "pick_2": 1}
    assert _resume(hero_waiting.id, answer) == SetStateStatus.ACCEPT
    state = local.execute(weekly_episode, hero_waiting.id)
    assert state.is_completed() and state.name == "Rejected", state
    assert _episode_state(harness) == "rejected"


@FORM_ONLY
def test_reordering_the_hero_videos_while_the_form_waits_asks_again(
    harness: str, hero_waiting: Any, tmp_path: Path
) -> None:
    """Pick fields are numbered in plan order, and a re-plan that only reorders the videos
    keeps every image (the keys do not depend on the order), so an answer to the old form
    could ship v01's pick for v03. The form's key names the videos its fields stand for: the
    old answer is not applied, a new form asks."""
    import yaml

    from episodic.pipeline.episode_plan import record_plan
    from episodic.storage.episodes import EpisodeRepository
    from tests.generation import Episode

    engine = make_engine(harness)
    original = yaml.safe_load((tmp_path / "pl" / "playlist.yaml").read_text())
    original["items"].reverse()  # the same videos (ids, titles, seeds, heroes), v03 first
    reordered = tmp_path / "pl" / "reordered.yaml"
    reordered.write_text(yaml.safe_dump(original, sort_keys=False))
    record_plan(engine, "weekly", "2026-W32-0", reordered)
    paid = jobs_per_key()
    Episode(engine, "2026-W32-0").generate()  # nothing to pay: the same images
    assert jobs_per_key() == paid
    engine.dispose()
    _, description = _form(hero_waiting.id)
    # valid under both numberings: applied to the new one it would ship v01=1 and v03=2
    old_answer = {"decision": "approve", "reviewer": "ann", "pick_1": 2, "pick_2": 1}
    assert _resume(hero_waiting.id, old_answer) == SetStateStatus.ACCEPT
    state = local.execute(weekly_episode, hero_waiting.id)
    assert state.is_paused(), state  # asked again: the answer was for another form
    schema, description = _form(hero_waiting.id)
    assert schema["properties"]["pick_1"]["title"] == "v03: the candidate that ships"
    assert "not recorded" in description and "review the images below" in description
    assert _resume(hero_waiting.id, {**old_answer, "pick_1": 1, "pick_2": 2}) == (
        SetStateStatus.ACCEPT
    )
    assert local.execute(weekly_episode, hero_waiting.id).is_completed()
    engine = make_engine(harness)
    try:
        pk = EpisodeRepository(engine).episode_pk("weekly", "2026-W32-0")
        assert ApprovalStore(engine).approved_picks(pk) == {"v03": 1, "v01": 2}
    finally:
        engine.dispose()
    assert jobs_per_key() == paid
