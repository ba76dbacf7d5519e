"""`generate_episode` under the Prefect test harness: cached items, limits, artifacts."""

from __future__ import annotations

from pathlib import Path

import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
from sqlalchemy import create_engine

from core.ids import WeekId
from flows.generate import generate_episode
from flows.limits import ensure_provider_limit
from pipeline.allocation import allocate
from pipeline.generation import record_plan
from tasks.generate import generate_item
from tests.generation import provider_log, submissions_per_item, write_playlist

pytestmark = pytest.mark.slow


@pytest.fixture
def episode(harness: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))
    ensure_provider_limit("fake", 8)
    engine = create_engine(harness)
    episode_id = str(
        allocate(
            engine, "weekly", WeekId.parse("2026-W32"), f"k-{tmp_path.name}"
        ).episode.episode_id
    )
    engine.dispose()
    return episode_id


def plan(url: str, episode_id: str, folder: Path, titles: list[str]) -> None:
    from storage.engine import make_engine

    engine = make_engine(url)
    record_plan(engine, "weekly", episode_id, write_playlist(folder, titles))
    engine.dispose()


def test_the_flow_generates_and_publishes_progress_and_cost(
    harness: str, episode: str, tmp_path: Path
) -> None:
    plan(harness, episode, tmp_path / "p", ["a", "b", "c"])
    result = generate_episode(episode_id=episode)
    assert result["state"] == "completed" and result["paid_submissions"] == 3
    assert set(submissions_per_item().values()) == {1}
    with get_client(sync_client=True) as client:
        keys = {
            a.key
            for a in client.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(like_="episode-2026-w32"))
            )
        }
    assert {f"episode-{episode.lower()}-progress", f"episode-{episode.lower()}-cost"} <= keys


def test_a_retried_flow_run_makes_no_new_paid_call_for_finished_items(
    harness: str, episode: str, tmp_path: Path
) -> None:
    plan(harness, episode, tmp_path / "p", ["a", "lost [[LOSE_RESPONSE]]", "c"])
    state = generate_episode.with_options(retries=1, retry_delay_seconds=0)(
        episode_id=episode, return_state=True
    )
    assert state.is_completed(), state.message
    assert state.result()["state"] == "completed"
    assert submissions_per_item() == {"v01.p1": 1, "v02.p1": 1, "v03.p1": 1}
    assert any(e["event"] == "lookup" for e in provider_log())  # reconciled, not resubmitted


def test_a_finished_item_is_a_cache_hit_without_the_database_or_provider(
    harness: str, episode: str, tmp_path: Path
) -> None:
    plan(harness, episode, tmp_path / "p", ["a"])
    result = generate_episode(episode_id=episode)
    events_before = len(provider_log())

    @flow
    def recreated() -> object:  # a re-created flow run asking for the same item again
        key, ledger_ref = _only_item(harness)
        return generate_item(result["run_id"], -1, "v01.p1", key, ledger_ref, return_state=True)

    state = recreated()
    assert state.name == "Cached"
    assert state.result()["outcome"] == "completed"
    assert len(provider_log()) == events_before


def _only_item(url: str) -> tuple[str, str]:
    from storage.engine import make_engine
    from storage.runs import RunStore

    engine = make_engine(url)
    store = RunStore(engine)
    (run,) = store.list_runs("weekly")
    (item,) = store.run_items(run.run_id)
    engine.dispose()
    return item.idempotency_key, item.ledger_ref


def test_a_missing_episode_fails_before_any_client_is_built(
    harness: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))
    state = generate_episode(episode_id="2026-W32-9", return_state=True)
    assert state.is_failed() and "not found" in (state.message or "")
    assert provider_log() == []


def test_episode_id_is_a_required_parameter() -> None:
    import inspect

    parameter = inspect.signature(generate_episode.fn).parameters["episode_id"]
    assert parameter.default is inspect.Parameter.empty
    assert "episode_id" in generate_episode.parameters.required
