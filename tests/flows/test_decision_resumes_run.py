"""One decision, whichever door.

Under the Prefect test harness (a real local API server): a weekly slot run suspended at its
approval form; `episodic approve` (a real process) records the decision and resumes that run,
which reads the decision on record, records nothing new and goes on; an answer from the form
for an episode already decided otherwise is refused in the form, the run waiting again.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.responses import SetStateStatus
from prefect.settings import PREFECT_API_URL

from episodic.flows import local
from episodic.flows.weekly import weekly_episode
from episodic.pipeline.approval import decide
from episodic.storage.approvals import ApprovalStore
from episodic.storage.engine import make_engine
from episodic.storage.episodes import EpisodeRepository
from tests.flows import test_decisions_stand, test_hero_approval
from tests.flows.test_prefect_path import _episode_state, _form, _resume

pytestmark = pytest.mark.slow

waiting = test_decisions_stand.waiting  # the fixture: a weekly slot run at its form
hero_waiting = test_hero_approval.hero_waiting  # the same with hero candidates
EPISODIC = shutil.which("episodic", path=str(Path(sys.executable).parent))


def _episodic(*args: str, api: str | None) -> subprocess.CompletedProcess[str]:
    """The installed command in its own process, with the Prefect API `api` (None: none)."""
    assert EPISODIC is not None
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    if api is not None:
        env["PREFECT_API_URL"] = api
    else:  # no profile's URL either
        env["PREFECT_PROFILES_PATH"] = os.devnull
    return subprocess.run(
        [EPISODIC, *args], capture_output=True, text=True, timeout=120, env=env, check=False
    )


def _decisions(url: str) -> int:
    engine = make_engine(url)
    try:
        (episode,) = EpisodeRepository(engine).list("weekly")
        pk = EpisodeRepository(engine).episode_pk("weekly", str(episode.episode_id))
        return len(ApprovalStore(engine).approvals(pk))
    finally:
        engine.dispose()


def test_approve_on_the_command_line_resumes_the_waiting_run_and_it_assembles(
    harness: str, waiting: Any
) -> None:
    """The decision is recorded and the suspended run resumes with it, to an assembled
    episode."""
    done = _episodic(
        "approve", "2026-W32-0", "--by", "carol", "--json", api=PREFECT_API_URL.value()
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["state"] == "approved" and result["changed"] is True
    assert result["resumed"]["flow_run"] is not None, result
    assert "resumed the waiting flow run" in result["resumed"]["message"]
    with get_client(sync_client=True) as client:
        assert not client.read_flow_run(waiting.id).state.is_paused()
    recorded = _decisions(harness)
    state = local.execute(weekly_episode, waiting.id)
    assert state.is_completed() and state.name == "Completed", state
    assert _episode_state(harness) == "assembled"
    assert _decisions(harness) == recorded  # the run recorded nothing new


def test_reject_on_the_command_line_resumes_the_run_which_ends_rejected(
    harness: str, waiting: Any
) -> None:
    done = _episodic(
        "approve",
        "2026-W32-0",
        "--reject",
        "--by",
        "carol",
        "--reason",
        "too dark",
        api=PREFECT_API_URL.value(),
    )
    assert done.returncode == 0, done.stderr
    assert "prefect: resumed the waiting flow run" in done.stdout, done.stdout
    state = local.execute(weekly_episode, waiting.id)
    assert state.is_completed() and state.name == "Rejected", state
    assert "rejected by carol" in (state.message or "")
    assert _episode_state(harness) == "rejected"


def test_without_a_prefect_api_the_decision_is_recorded_and_the_cli_says_nothing_resumed(
    harness: str, waiting: Any
) -> None:
    done = _episodic("approve", "2026-W32-0", "--by", "carol", api=None)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "2026-W32-0 is now approved", lines
    assert lines[1] == (
        "  prefect: no Prefect API configured (PREFECT_API_URL): no waiting flow run was resumed"
    ), lines
    assert _episode_state(harness) == "approved"
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(waiting.id).state.is_paused()


def test_a_form_answer_for_an_episode_decided_otherwise_is_refused_in_the_form(
    harness: str, waiting: Any
) -> None:
    """Approved on the command line without a Prefect API (the run still waits); a reviewer
    then rejects in the form: the run must not end green with only a WARNING. It suspends
    again with a form saying whose decision stands; answering that decision lets it go on."""
    engine = make_engine(harness)
    decide(engine, "weekly", "2026-W32-0", approve=True, by="carol", note=None)
    engine.dispose()
    answer = {"decision": "reject", "reviewer": "dave", "note": "too dark"}
    assert _resume(waiting.id, answer) == SetStateStatus.ACCEPT
    state = local.execute(weekly_episode, waiting.id)
    assert state.is_paused(), state
    schema, description = _form(waiting.id)
    top = description.splitlines()[0]
    assert "Your answer (reject by dave) was not recorded" in top, description
    assert "approved by carol at" in top, description
    # The refusal is said once, and the form shows no images, so it speaks of none.
    assert description.count("not recorded") == 1, description
    assert description.count("approved by carol") == 1, description
    shown = json.dumps(schema) + description
    assert "images above" not in shown and "exactly the images" not in shown, shown
    assert "decision on record (above) stands" in schema["properties"]["decision"]["description"]
    assert _episode_state(harness) == "approved"
    again = {"decision": "reject", "reviewer": "dave", "note": "still too dark"}
    assert _resume(waiting.id, again) == SetStateStatus.ACCEPT  # refused again, visibly
    assert local.execute(weekly_episode, waiting.id).is_paused()
    assert "Your answer (reject by dave)" in _form(waiting.id)[1]
    same = {"decision": "approve", "reviewer": "dave"}  # the decision on record: fine
    assert _resume(waiting.id, same) == SetStateStatus.ACCEPT
    state = local.execute(weekly_episode, waiting.id)
    assert state.is_completed() and state.name == "Completed", state
    assert _episode_state(harness) == "assembled"


def test_an_approval_with_picks_on_the_command_line_resumes_the_hero_form(
    harness: str, hero_waiting: Any
) -> None:
    """The hero form requires a pick per hero video: the resume answers them from the
    recorded picks, and the run ships those."""
    done = _episodic(
        "approve",
        "2026-W32-0",
        "--by",
        "carol",
        "--pick",
        "v01=3,v03=1",
        "--json",
        api=PREFECT_API_URL.value(),
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["resumed"]["flow_run"] is not None, done.stdout
    state = local.execute(weekly_episode, hero_waiting.id)
    assert state.is_completed() and state.name == "Completed", state
    assert _episode_state(harness) == "assembled"
    engine = make_engine(harness)
    try:
        pk = EpisodeRepository(engine).episode_pk("weekly", "2026-W32-0")
        assert ApprovalStore(engine).approved_picks(pk) == {"v01": 3, "v03": 1}
        assert len(ApprovalStore(engine).approvals(pk)) == 1
    finally:
        engine.dispose()
