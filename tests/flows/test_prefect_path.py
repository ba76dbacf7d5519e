"""The weekly pipeline as Prefect users run it, under the test harness.

The approval form: required fields checked by the server before the run resumes, answers we
refuse re-asked with the reason (never stuck on a stored bad answer), the images shown, a
rejection that ends in its own state, a duplicate run that joins the waiting one. Artifacts
that describe the episode; the pipeline's one timezone.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.responses import SetStateStatus
from prefect.schedules import Cron

from episodic.flows import local
from episodic.flows.weekly import weekly_episode
from episodic.storage.engine import make_engine
from episodic.storage.episodes import EpisodeRepository
from tests.generation import submissions_per_item, write_playlist

pytestmark = pytest.mark.slow

MONDAY = datetime(2026, 8, 3, tzinfo=UTC)  # 2026-W32


def _deploy(playlist: Path | None, cron: str = "0 9 * * 1", timezone: str = "UTC") -> UUID:
    name = f"path-{uuid4().hex[:8]}"
    parameters = {"playlist": str(playlist)} if playlist else {}
    schedule = Cron(cron, timezone=timezone, slug=f"{name}-slot")
    return local.apply_deployment(weekly_episode, name, schedule, parameters=parameters)


@pytest.fixture
def waiting(harness: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A weekly slot run suspended at its approval form (two images paid)."""
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))
    deployment = _deploy(write_playlist(tmp_path / "pl", ["a", "b"]))
    (run,) = local.schedule_slots(deployment, MONDAY, MONDAY + timedelta(days=7, seconds=-1))
    state = local.execute(weekly_episode, run.id)
    assert state.is_paused(), state
    return run


def test_a_slot_scheduled_for_later_runs_now_for_its_own_slot(
    harness: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make demo` runs this week's slots; on a Monday before 09:00 the Monday slot is still
    ahead, and Prefect would make the run wait until 09:00. Executing a slot now keeps the
    slot it stands for: its expected start time and its episode are the slot's."""
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))
    deployment = _deploy(None)
    future = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    future += timedelta(days=14 - future.weekday())  # a Monday two weeks or less ahead
    (run,) = local.schedule_slots(deployment, future, future + timedelta(days=7, seconds=-1))
    assert run.expected_start_time is not None and run.expected_start_time > datetime.now(UTC)
    state = local.execute(weekly_episode, run.id)
    assert state.is_completed(), state
    with get_client(sync_client=True) as client:
        after = client.read_flow_run(run.id)
    assert after.expected_start_time == run.expected_start_time
    week = run.expected_start_time.isocalendar()
    assert state.result().startswith(f"{week.year}-W{week.week:02d}-")


def _form(flow_run_id: UUID) -> tuple[dict[str, Any], str]:
    """The waiting form's JSON schema and its description (what the UI renders)."""
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(flow_run_id).state
        assert state is not None and state.is_paused(), state
        keyset = state.state_details.run_input_keyset
        assert keyset is not None
        schema = json.loads(client.read_flow_run_input(flow_run_id, keyset["schema"]))
        description = json.loads(client.read_flow_run_input(flow_run_id, keyset["description"]))
    return schema, description


def _resume(flow_run_id: UUID, answer: dict[str, Any]) -> SetStateStatus:
    with get_client(sync_client=True) as client:
        return client.resume_flow_run(flow_run_id, run_input=answer).status


def _episode_state(url: str) -> str:
    engine = make_engine(url)
    try:
        (episode,) = EpisodeRepository(engine).list("weekly")
        return episode.state
    finally:
        engine.dispose()


def test_the_form_requires_a_decision_and_a_reviewer_and_shows_the_images(
    harness: str, waiting: Any
) -> None:
    schema, description = _form(waiting.id)
    assert set(schema["required"]) == {"decision", "reviewer"}  # not "(Optional)" in the UI
    assert schema["properties"]["reviewer"]["minLength"] == 1
    assert description.count("](data:image/jpeg;base64,") == 2  # the images themselves
    assert "0.08 USD in 2 paid calls" in description and "| 0.04 USD |" in description


def test_an_empty_reviewer_is_refused_before_the_run_resumes(harness: str, waiting: Any) -> None:
    for bad in ({"decision": "approve", "reviewer": ""}, {"decision": "approve"}, {}):
        assert _resume(waiting.id, bad) != SetStateStatus.ACCEPT
        _form(waiting.id)  # still paused at the same form
    assert _resume(waiting.id, {"decision": "approve", "reviewer": "ann"}) == SetStateStatus.ACCEPT
    state = local.execute(weekly_episode, waiting.id)
    assert state.is_completed(), state
    assert _episode_state(harness) == "assembled"
    assert sum(submissions_per_item().values()) == 2  # nothing paid again


def test_an_answer_we_refuse_is_asked_again_with_the_reason_and_never_sticks(
    harness: str, waiting: Any
) -> None:
    """An answer the schema accepts but we refuse (a name with a character that is not
    printable, as a zero-width space; a rejection without a note and control characters are
    refused by the schema itself) re-suspends with the
    reason shown; a UI Retry replays the refused answers and waits again instead of failing
    forever."""
    answer = {"decision": "approve", "reviewer": "bob\u200b"}
    assert _resume(waiting.id, answer) == SetStateStatus.ACCEPT
    state = local.execute(weekly_episode, waiting.id)
    assert state.is_paused(), state
    _, description = _form(waiting.id)
    assert "not recorded" in description and "reviewer needs a name" in description
    assert "--" not in description.split("\n")[0]  # worded for the form, not a CLI flag
    assert _resume(waiting.id, {"decision": "approve", "reviewer": "ann\u2028"}) == (
        SetStateStatus.ACCEPT
    )
    assert local.execute(weekly_episode, waiting.id).is_paused()
    assert _episode_state(harness) == "generated"
    assert local.retry(weekly_episode, waiting.id).is_paused()  # a UI Retry: waits again
    assert _resume(waiting.id, {"decision": "approve", "reviewer": "ann"}) == SetStateStatus.ACCEPT
    state = local.execute(weekly_episode, waiting.id)
    assert state.is_completed() and state.name == "Completed", state
    assert _episode_state(harness) == "assembled"
    again = local.retry(weekly_episode, waiting.id)  # replays every stored answer: no form
    assert again.is_completed(), again
    assert sum(submissions_per_item().values()) == 2


def test_a_rejected_run_ends_in_a_state_named_rejected_and_the_decision_is_an_artifact(
    harness: str, waiting: Any
) -> None:
    from prefect.artifacts import Artifact

    answer = {"decision": "reject", "reviewer": "bob", "note": "too dark"}
    assert _resume(waiting.id, answer) == SetStateStatus.ACCEPT
    state = local.execute(weekly_episode, waiting.id)
    assert state.is_completed() and state.name == "Rejected", state
    assert "too dark" in (state.message or "")
    assert _episode_state(harness) == "rejected"
    decision = Artifact.get("episode-2026-w32-0-decision")
    assert decision is not None and "reject" in str(decision.data) and "bob" in str(decision.data)


def test_a_duplicate_run_of_the_slot_joins_the_waiting_one(harness: str, waiting: Any) -> None:
    """Two workers on one slot, a double click: the second run of the episode finds it
    waiting for a decision and ends green ("Joined"), with one form between them."""
    engine = make_engine(harness)
    (episode,) = EpisodeRepository(engine).list("weekly")
    engine.dispose()
    duplicate = weekly_episode(
        allocation_key=episode.allocation_key,
        week="2026-W32",
        playlist=None,
        return_state=True,
    )
    assert duplicate.is_completed() and duplicate.result() == "2026-W32-0"
    with get_client(sync_client=True) as client:
        deployment_id = client.read_flow_run(waiting.id).deployment_id
        assert deployment_id is not None
        run = client.create_flow_run_from_deployment(
            deployment_id,
            parameters={"allocation_key": episode.allocation_key, "week": "2026-W32"},
        )
    state = local.execute(weekly_episode, run.id)
    assert state.is_completed() and state.name == "Joined", state
    _form(waiting.id)  # the first run still waits
    assert sum(submissions_per_item().values()) == 2


def test_artifacts_describe_the_episode_not_the_last_run(harness: str, waiting: Any) -> None:
    """A resume pays nothing: the cost artifact still shows the episode's paid calls and
    cost, progress reads 100%, and the assembly record shows the cover."""
    from prefect.artifacts import Artifact

    from episodic.flows.generate import generate_episode

    generate_episode(episode_id="2026-W32-0")  # a resume with nothing to do
    cost = Artifact.get("episode-2026-w32-0-cost")
    assert cost is not None
    (row,) = json.loads(str(cost.data))
    assert row["paid calls"] == 2 and row["cost"] == "0.08 USD"
    assert row["images done"] == "2 of 2"
    progress = Artifact.get("episode-2026-w32-0-progress")
    assert progress is not None and float(str(progress.data)) == 100.0
    assert _resume(waiting.id, {"decision": "approve", "reviewer": "ann"}) == SetStateStatus.ACCEPT
    assert local.execute(weekly_episode, waiting.id).is_completed()
    assembly = Artifact.get("episode-2026-w32-0-assembly")
    assert assembly is not None and "](data:image/jpeg;base64," in str(assembly.data)


def test_flow_runs_are_named_after_the_episode(harness: str, waiting: Any) -> None:
    from episodic.flows.generate import generate_episode

    with get_client(sync_client=True) as client:
        assert client.read_flow_run(waiting.id).name == "weekly 2026-W32-0 · Mon 09:00 UTC"
    state = generate_episode(episode_id="2026-W32-0", return_state=True)
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(state.state_details.flow_run_id)
    assert run.name == "generate 2026-W32-0"


def test_failure_messages_in_prefect_name_the_deployment_not_a_cli_command(
    harness: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from episodic.core.ids import WeekId
    from episodic.flows.generate import generate_episode
    from episodic.pipeline.allocation import allocate

    engine = make_engine(harness)
    allocate(engine, "weekly", WeekId.parse("2026-W32"), "unplanned")
    engine.dispose()
    state = generate_episode(episode_id="2026-W32-0", return_state=True)
    assert state.is_failed()
    assert "plan deployment" in (state.message or "") and "episodic plan" not in (
        state.message or ""
    )


# ---------------------------------------------------------------- one timezone truth


def test_the_week_comes_from_the_recorded_timezone_even_without_the_variable(
    harness: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Monday 00:30 Berlin (ISO week 46) on a worker without EPISODIC_TIMEZONE is not
    allocated as 2026-W45: the zone recorded for the pipeline wins."""
    from episodic.pipeline.pipelines import set_timezone

    engine = make_engine(harness)
    set_timezone(engine, "weekly", "Europe/Berlin")
    engine.dispose()
    monkeypatch.delenv("EPISODIC_TIMEZONE", raising=False)
    deployment = _deploy(None, cron="30 0 * * 1", timezone="Europe/Berlin")
    start = datetime(2026, 11, 8, 12, tzinfo=UTC)
    (run,) = local.schedule_slots(deployment, start, start + timedelta(days=2))
    assert run.expected_start_time == datetime(2026, 11, 8, 23, 30, tzinfo=UTC)  # Sunday UTC
    assert local.execute(weekly_episode, run.id).result() == "2026-W46-0"


def test_a_worker_whose_timezone_disagrees_refuses_before_allocating(
    harness: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from episodic.pipeline.pipelines import set_timezone

    engine = make_engine(harness)
    set_timezone(engine, "weekly", "Europe/Berlin")
    monkeypatch.setenv("EPISODIC_TIMEZONE", "UTC")
    state = weekly_episode(week="2026-W32", return_state=True)
    assert state.is_failed()
    assert "runs in Europe/Berlin" in (state.message or "")
    assert EpisodeRepository(engine).list("weekly") == []
    engine.dispose()


# ---------------------------------------------------------------- setup, serve, deploy


def test_setup_is_idempotent_and_serve_and_deploy_never_take_over_each_other(
    harness: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect.client.schemas.actions import WorkPoolCreate

    from episodic.core.errors import ProviderConfigError
    from episodic.deployments.serve import all_deployments
    from episodic.deployments.setup import prefect_setup

    monkeypatch.setenv("EPISODIC_TIMEZONE", "Europe/Berlin")
    first = prefect_setup(mode="serve")
    assert first["timezone"] == "Europe/Berlin" and first == prefect_setup(mode="serve")
    assert {"profile": "fake", "limit": 8} in first["limits"]
    served = all_deployments(first["timezone"])
    ids = [deployment.apply() for deployment in served]
    try:
        weekly = next(d for d in served if d.name == "weekly")
        assert sorted(s.slug or "" for s in weekly.schedules) == [
            "weekly-monday-0900",
            "weekly-thursday-0900",
        ]
        with pytest.raises(ProviderConfigError, match="served by `episodic serve`"):
            prefect_setup(mode="deploy")
        prefect_setup(mode="serve")  # serving again over served ones is fine
        with get_client(sync_client=True) as client:
            client.create_work_pool(WorkPoolCreate(name=f"pool-{uuid4().hex[:6]}", type="process"))
            pool = client.read_work_pools()[-1].name
            client.update_deployment(ids[0], _work_pool_update(pool))
        with pytest.raises(ProviderConfigError, match="registered for work pool"):
            prefect_setup(mode="serve")
    finally:
        with get_client(sync_client=True) as client:
            for deployment_id in ids:
                client.delete_deployment(deployment_id)


def _work_pool_update(pool: str) -> Any:
    from prefect.client.schemas.actions import DeploymentUpdate

    return DeploymentUpdate(work_pool_name=pool)


# ---------------------------------------------------------------- decisions from elsewhere


def test_a_run_of_an_already_decided_episode_follows_the_decision_without_a_form(
    harness: str, waiting: Any
) -> None:
    """Decided on the command line while the form waited: a duplicate run of the episode
    shows no empty form; it follows the decision (approve: assembles) and ends green."""
    from episodic.pipeline.approval import decide

    engine = make_engine(harness)
    decide(engine, "weekly", "2026-W32-0", approve=True, by="cli", note=None)
    (episode,) = EpisodeRepository(engine).list("weekly")
    engine.dispose()
    with get_client(sync_client=True) as client:
        deployment_id = client.read_flow_run(waiting.id).deployment_id
        assert deployment_id is not None
        run = client.create_flow_run_from_deployment(
            deployment_id,
            parameters={"allocation_key": episode.allocation_key, "week": "2026-W32"},
        )
    state = local.execute(weekly_episode, run.id)
    assert state.is_completed() and state.name == "Completed", state
    assert _episode_state(harness) == "assembled"
    assert sum(submissions_per_item().values()) == 2


def test_a_conflicting_answer_after_a_decision_elsewhere_follows_the_decision(
    harness: str, waiting: Any
) -> None:
    """The form waits; someone approves on the command line; the form is then answered
    "reject": the run does not stick, nor drop the answer silently: it waits
    again with a form saying so; answered with the recorded approval, it assembles."""
    from episodic.pipeline.approval import decide
    from episodic.storage.approvals import ApprovalStore

    engine = make_engine(harness)
    decide(engine, "weekly", "2026-W32-0", approve=True, by="cli", note=None)
    answer = {"decision": "reject", "reviewer": "ann", "note": "no"}
    assert _resume(waiting.id, answer) == SetStateStatus.ACCEPT
    assert local.execute(weekly_episode, waiting.id).is_paused()
    assert "Your answer (reject by ann) was not recorded" in _form(waiting.id)[1]
    assert _resume(waiting.id, {"decision": "approve", "reviewer": "ann"}) == (
        SetStateStatus.ACCEPT
    )
    state = local.execute(weekly_episode, waiting.id)
    assert state.is_completed() and state.name == "Completed", state
    assert _episode_state(harness) == "assembled"
    pk = EpisodeRepository(engine).episode_pk("weekly", "2026-W32-0")
    assert [a["by"] for a in ApprovalStore(engine).approvals(pk)] == ["cli"]  # not recorded
    engine.dispose()


def test_an_answer_to_a_form_whose_images_changed_is_explained(
    harness: str, waiting: Any, tmp_path: Path
) -> None:
    from episodic.pipeline.episode_plan import record_plan

    engine = make_engine(harness)
    record_plan(engine, "weekly", "2026-W32-0", write_playlist(tmp_path / "b", ["a", "NEW"]))
    engine.dispose()
    assert _resume(waiting.id, {"decision": "approve", "reviewer": "ann"}) == (
        SetStateStatus.ACCEPT
    )
    assert local.execute(weekly_episode, waiting.id).is_paused()
    _, description = _form(waiting.id)
    assert "not applied" in description and "changed" in description
    assert _episode_state(harness) == "generated"


def test_people_s_text_cannot_forge_markdown_in_artifacts(harness: str, waiting: Any) -> None:
    """A reviewer or note with Markdown or HTML shows as text: no forged heading, no image
    (a tracking pixel) and no HTML element in the decision artifact."""
    from prefect.artifacts import Artifact

    answer = {
        "decision": "reject",
        "reviewer": "<img src=x onerror=alert(1)>",
        "note": "too dark\n\n## Episode 2026-W32-0: approve\n\n![p](http://attacker.invalid/p.png)",
    }
    assert _resume(waiting.id, answer) == SetStateStatus.ACCEPT
    assert local.execute(weekly_episode, waiting.id).name == "Rejected"
    decision = Artifact.get("episode-2026-w32-0-decision")
    assert decision is not None
    text = str(decision.data)
    assert not re.search(r"(?<!\\)<img", text) and not re.search(r"(?<!\\)!\[", text)
    assert "\n## Episode 2026-W32-0: approve" not in text
    cost = Artifact.get("episode-2026-w32-0-cost")
    assert cost is not None and json.loads(str(cost.data))[0]["state"] == "rejected"


def test_a_scheduled_run_refuses_when_the_schedule_is_in_another_zone_than_the_record(
    harness: str,
) -> None:
    """`pipelines set-timezone` without a redeploy: the run refuses instead of allocating
    its slot in another week."""
    from episodic.pipeline.pipelines import set_timezone

    engine = make_engine(harness)
    set_timezone(engine, "weekly", "Pacific/Honolulu")
    engine.dispose()
    deployment = _deploy(None, cron="0 9 * * 1", timezone="Europe/Berlin")
    (run,) = local.schedule_slots(deployment, MONDAY, MONDAY + timedelta(days=7, seconds=-1))
    state = local.execute(weekly_episode, run.id)
    assert state.is_failed() and "redeploy" in (state.message or ""), state
    engine = make_engine(harness)
    assert EpisodeRepository(engine).list("weekly") == []
    engine.dispose()


def test_serve_refuses_a_playlist_it_cannot_read_and_another_pipeline_s_deployments(
    harness: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from episodic.core.errors import InvalidInput, ProviderConfigError
    from episodic.deployments.serve import all_deployments, serve_all
    from episodic.deployments.setup import prefect_setup

    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidInput, match=r"playlist examples/playlist\.yaml not found"):
        serve_all()
    ids = [d.apply() for d in all_deployments("UTC", "weekly")]
    try:
        with pytest.raises(ProviderConfigError, match="registered for pipeline weekly"):
            prefect_setup("news", mode="serve")
    finally:
        with get_client(sync_client=True) as client:
            for deployment_id in ids:
                client.delete_deployment(deployment_id)
