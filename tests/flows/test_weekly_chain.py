"""The whole weekly chain in a deployment run: generate, suspend for approval, assemble.

The flow run suspends with a typed input form (no worker held); `resume_flow_run` with input
plays the reviewer in the UI; the resumed run starts from the top and makes no paid call.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
from prefect.client.orchestration import get_client
from prefect.flow_runs import resume_flow_run
from prefect.schedules import Cron

from episodic.flows import local
from episodic.flows.weekly import weekly_episode
from episodic.storage.engine import make_engine
from episodic.storage.episodes import EpisodeRepository
from tests.generation import provider_log, stored_image, submissions_per_item, write_playlist

pytestmark = pytest.mark.slow


@pytest.fixture
def suspended(harness: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))
    playlist = write_playlist(tmp_path / "pl", ["a", "b"])
    name = f"chain-{uuid4().hex[:8]}"
    deployment = local.apply_deployment(
        weekly_episode,
        name,
        Cron("0 9 * * 1", timezone="UTC", slug=f"{name}-slot"),
        parameters={"playlist": str(playlist)},
    )
    start = datetime(2026, 8, 3, tzinfo=UTC)
    (run,) = local.schedule_slots(deployment, start, start + timedelta(days=7, seconds=-1))
    state = local.execute(weekly_episode, run.id)
    assert state.is_paused(), state
    return run


def episode_state(url: str) -> str:
    engine = make_engine(url)
    (episode,) = EpisodeRepository(engine).list("weekly")
    engine.dispose()
    return episode.state


def test_approve_from_the_ui_assembles_and_pays_nothing_more(harness: str, suspended: Any) -> None:
    assert episode_state(harness) == "generated"
    with get_client(sync_client=True) as client:
        paused = client.read_flow_run(suspended.id).state
    assert paused is not None and paused.state_details.run_input_keyset  # a form is waiting
    paid_before = dict(submissions_per_item())
    resume_flow_run(
        suspended.id, run_input={"decision": "approve", "reviewer": "ann", "note": "lovely"}
    )
    state = local.execute(weekly_episode, suspended.id)
    assert state.is_completed(), state
    assert state.result() == "2026-W32-0"
    assert episode_state(harness) == "assembled"
    assert dict(submissions_per_item()) == paid_before == {"v01.p1": 1, "v02.p1": 1}
    assert [e["event"] for e in provider_log()].count("submit") == 2


def test_the_weekly_run_shows_one_cost_and_one_progress_card(harness: str, suspended: Any) -> None:
    """The approval step and assembly both publish `-cost`: one card per key on the run,
    updated in place (not a new artifact per publication), the final one reading 100% and
    the assembled state."""
    import json

    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    resume_flow_run(suspended.id, run_input={"decision": "approve", "reviewer": "ann"})
    state = local.execute(weekly_episode, suspended.id)
    assert state.is_completed(), state
    with get_client(sync_client=True) as client:
        cards = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[suspended.id]))
        )
    by_key: dict[str, list[Any]] = {}
    for card in cards:
        by_key.setdefault(str(card.key), []).append(card.data)
    cost, progress = "episode-2026-w32-0-cost", "episode-2026-w32-0-progress"
    assert len(by_key[cost]) == 1 and len(by_key[progress]) == 1, by_key
    assert float(by_key[progress][0]) == 100.0
    (row,) = json.loads(by_key[cost][0])
    assert row["state"] == "assembled" and row["paid calls"] == 2 and row["still running"] == 0


def test_editing_the_playlist_while_the_run_waits_changes_nothing_it_ships(
    harness: str, suspended: Any, tmp_path: Path
) -> None:
    """The resumed run starts from the top; it must not re-plan from the edited
    file. Approve assembles exactly the images the reviewer saw; nothing more is paid."""
    import json

    from episodic.storage.approvals import ApprovalStore

    write_playlist(tmp_path / "pl", ["a", "EDITED WHILE WAITING", "extra"])  # same file
    paid_before = dict(submissions_per_item())
    resume_flow_run(suspended.id, run_input={"decision": "approve", "reviewer": "ann"})
    state = local.execute(weekly_episode, suspended.id)
    assert state.is_completed(), state
    assert episode_state(harness) == "assembled"
    assert dict(submissions_per_item()) == paid_before == {"v01.p1": 1, "v02.p1": 1}
    engine = make_engine(harness)
    pk = EpisodeRepository(engine).episode_pk("weekly", "2026-W32-0")
    approved = ApprovalStore(engine).approved_items(pk)
    manifest_key = EpisodeRepository(engine).media(pk)["manifest"].key
    engine.dispose()
    manifest = json.loads(stored_image(str(manifest_key)))
    assert approved == {i["idempotency_key"]: i["sha256"] for i in manifest["items"]}
    assert [i["item_id"] for i in manifest["items"]] == ["v01.p1", "v02.p1"]


def test_a_replan_while_the_run_waits_makes_it_ask_again_instead_of_approving(
    harness: str, suspended: Any, tmp_path: Path
) -> None:
    """Another operator re-plans the waiting episode: the reviewer's answer was about the
    old images, so the resumed run (which generates the new plan) asks again with a new form;
    nothing is approved or assembled that the form did not show."""
    from episodic.pipeline.episode_plan import record_plan

    engine = make_engine(harness)
    record_plan(engine, "weekly", "2026-W32-0", write_playlist(tmp_path / "b", ["a", "NEW"]))
    engine.dispose()
    resume_flow_run(suspended.id, run_input={"decision": "approve", "reviewer": "ann"})
    state = local.execute(weekly_episode, suspended.id)
    assert state.is_paused(), state  # a new form, for the images of the new plan
    assert episode_state(harness) == "generated"


def test_reject_from_the_ui_records_it_and_does_not_assemble(harness: str, suspended: Any) -> None:
    resume_flow_run(
        suspended.id, run_input={"decision": "reject", "reviewer": "bob", "note": "too dark"}
    )
    state = local.execute(weekly_episode, suspended.id)
    assert state.is_completed(), state
    assert episode_state(harness) == "rejected"
    assert sum(submissions_per_item().values()) == 2


def test_review_flows_refuse_episodes_in_the_wrong_state(harness: str) -> None:
    from episodic.core.ids import WeekId
    from episodic.flows.review import approve_episode, assemble_episode
    from episodic.pipeline.allocation import allocate

    engine = make_engine(harness)
    allocate(engine, "weekly", WeekId.parse("2026-W32"), "never-generated")
    engine.dispose()
    approving = approve_episode(episode_id="2026-W32-0", return_state=True)
    assert approving.is_failed() and "only a generated episode" in (approving.message or "")
    assembling = assemble_episode(episode_id="2026-W32-0", return_state=True)
    assert assembling.is_failed() and "only an approved episode" in (assembling.message or "")
    missing = assemble_episode(episode_id="2026-W32-7", return_state=True)
    assert missing.is_failed() and "not found" in (missing.message or "")
