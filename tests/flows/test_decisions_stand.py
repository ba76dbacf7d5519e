"""A decision stands, one approval wins visibly, "Suspending" only when it suspends.

Under the Prefect test harness: the weekly chain suspends at its form, the reviewer answers
through the resume endpoint (as the UI does), and a UI Retry puts the same flow run back in
Scheduled and runs it again (`local.retry`).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
from prefect.client.schemas.objects import State
from prefect.client.schemas.responses import SetStateStatus
from prefect.logging.handlers import APILogWorker
from prefect.states import Scheduled

from episodic.flows import local
from episodic.flows.weekly import weekly_episode
from episodic.pipeline.approval import decide
from episodic.pipeline.episode_plan import record_plan
from episodic.storage.engine import make_engine
from tests.flows.test_prefect_path import MONDAY, _deploy, _episode_state, _form, _resume
from tests.generation import submissions_per_item, write_playlist

pytestmark = pytest.mark.slow

REJECT = {"decision": "reject", "reviewer": "bob", "note": "too dark"}


@pytest.fixture
def waiting(harness: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A weekly slot run suspended at its approval form (two images paid)."""
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))
    deployment = _deploy(write_playlist(tmp_path / "pl", ["a", "b"]))
    (run,) = local.schedule_slots(deployment, MONDAY, MONDAY + timedelta(days=7, seconds=-1))
    state = local.execute(weekly_episode, run.id)
    assert state.is_paused(), state
    return run


def _ui_retry(flow_run_id: UUID) -> State[Any]:
    """What the UI's Retry button sends (an unforced `Scheduled` named AwaitingRetry), then
    the run executed again as a worker would."""
    with get_client(sync_client=True) as client:
        answer = client.set_flow_run_state(
            flow_run_id, Scheduled(name="AwaitingRetry", message="Retry from the UI")
        )
    assert answer.status == SetStateStatus.ACCEPT, answer
    return local.execute(weekly_episode, flow_run_id)


def _logs(flow_run_id: UUID) -> list[str]:
    APILogWorker.drain_all(timeout=5)
    with get_client(sync_client=True) as client:
        logs = client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])), limit=200
        )
    return [log.message for log in logs]


def test_a_retry_of_a_rejected_run_ends_rejected_again_saying_who_and_why(
    harness: str, waiting: Any
) -> None:
    """A retried run's generate with nothing to do leaves the episode rejected (never
    rejected -> generated), and no fresh form without a trace of the rejection appears."""
    assert _resume(waiting.id, REJECT) == SetStateStatus.ACCEPT
    first = local.execute(weekly_episode, waiting.id)
    assert first.is_completed() and first.name == "Rejected", first
    for retry in (_ui_retry, lambda run_id: local.retry(weekly_episode, run_id)):
        again = retry(waiting.id)
        assert again.is_completed() and again.name == "Rejected", again
        assert "rejected by bob" in (again.message or "") and "too dark" in (again.message or "")
        assert _episode_state(harness) == "rejected"
    logs = _logs(waiting.id)
    assert any("rejected by bob" in m and "stands" in m and "too dark" in m for m in logs), logs
    assert sum(submissions_per_item().values()) == 2


def test_the_form_of_an_episode_replanned_after_a_rejection_shows_that_rejection(
    harness: str, waiting: Any, tmp_path: Path
) -> None:
    assert _resume(waiting.id, REJECT) == SetStateStatus.ACCEPT
    assert local.execute(weekly_episode, waiting.id).name == "Rejected"
    engine = make_engine(harness)
    record_plan(engine, "weekly", "2026-W32-0", write_playlist(tmp_path / "b", ["a", "lighter"]))
    engine.dispose()
    assert _episode_state(harness) == "allocated"
    state = _ui_retry(waiting.id)
    assert state.is_paused(), state  # a new form, for the new plan's images
    _, description = _form(waiting.id)
    assert "Rejected before" in description and "bob" in description, description
    assert "too dark" in description
    assert "not applied" not in description  # the rejection was applied in its own attempt
    assert sum(submissions_per_item().values()) == 3  # only the changed image was bought


def test_a_form_answer_that_loses_to_another_decision_says_so(harness: str, waiting: Any) -> None:
    """The form waits; someone rejects on the command line (no Prefect API: the run still
    waits); the form is then answered "approve": the run suspends again with a form saying
    the answer was not recorded, naming the recorded decision (never a green end with
    only a WARNING). Answering the recorded decision ends it Rejected."""
    engine = make_engine(harness)
    decide(engine, "weekly", "2026-W32-0", approve=False, by="cli", note="wrong prompt")
    engine.dispose()
    answer = {"decision": "approve", "reviewer": "ann"}
    assert _resume(waiting.id, answer) == SetStateStatus.ACCEPT
    state = local.execute(weekly_episode, waiting.id)
    assert state.is_paused(), state
    description = _form(waiting.id)[1]
    assert "not recorded" in description and "rejected by cli" in description, description
    logs = _logs(waiting.id)
    assert any("not recorded" in m and "rejected by cli" in m for m in logs), logs
    assert _resume(waiting.id, REJECT) == SetStateStatus.ACCEPT
    state = local.execute(weekly_episode, waiting.id)
    assert state.is_completed() and state.name == "Rejected", state
    assert "rejected by cli" in (state.message or ""), state
    assert _episode_state(harness) == "rejected"


def test_suspending_is_logged_only_when_the_run_suspends(harness: str, waiting: Any) -> None:
    """Before, Prefect's "Suspending flow run" line followed every resume, although the
    resumed run never suspended again."""
    assert [m for m in _logs(waiting.id) if m.startswith("Suspending flow run")] != []
    suspended_before = sum(m.startswith("Suspending flow run") for m in _logs(waiting.id))
    answer = {"decision": "approve", "reviewer": "ann"}
    assert _resume(waiting.id, answer) == SetStateStatus.ACCEPT
    state = local.execute(weekly_episode, waiting.id)
    assert state.is_completed(), state
    assert sum(m.startswith("Suspending flow run") for m in _logs(waiting.id)) == (suspended_before)


def test_answers_the_form_rules_refuse_are_refused_at_once_in_words(
    harness: str, waiting: Any
) -> None:
    """A blank reviewer and a rejection without a note are refused by the server at the
    resume itself, in words (not "' ' does not match '\\S'"), and the run keeps waiting at
    the same form, rather than resuming only to come back with the reason once a worker
    runs it again."""
    before, _ = _form(waiting.id)
    for answer, words in (
        ({"decision": "approve", "reviewer": "  "}, "a name, not only spaces"),
        ({"decision": "reject", "reviewer": "bob", "note": " "}, "a rejection needs one"),
        ({"decision": "approve", "reviewer": "ann\x07"}, "without control characters"),
    ):
        with get_client(sync_client=True) as client:
            result = client.resume_flow_run(waiting.id, run_input=answer)
        assert result.status == SetStateStatus.REJECT, (answer, result)
        reason = str(getattr(result.details, "reason", ""))
        assert words in reason and "does not match" not in reason, reason
        assert _form(waiting.id)[0] == before  # still paused at the same form
    assert _resume(waiting.id, REJECT) == SetStateStatus.ACCEPT
    assert local.execute(weekly_episode, waiting.id).name == "Rejected"


def test_the_ui_s_own_form_check_names_the_field_and_what_is_wanted(
    harness: str, waiting: Any
) -> None:
    """Both Prefect UIs check a form through the server's `/ui/schemas/validate` (v2 sends
    the form's schema as stored; v1 drops `if`/`then` first and so learns the reason from the
    resume's refusal, checked above): the error sits under the field, in words."""
    schema, _ = _form(waiting.id)
    with get_client(sync_client=True) as client:
        response = client.request(
            "POST",
            "/ui/schemas/validate",
            json={"schema": schema, "values": {"decision": "reject", "reviewer": " ", "note": ""}},
        )
    response.raise_for_status()
    answer = response.json()
    assert answer["valid"] is False, answer
    errors = {e["property"]: e["errors"] for e in answer["errors"] if "property" in e}
    assert any("a name, not only spaces" in m for m in errors["reviewer"]), answer
    assert any("a rejection needs one" in m for m in errors["note"]), answer
