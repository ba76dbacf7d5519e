"""The ledger's side of a cancelled or killed Prefect flow run, on
both backends, without Prefect: flow run ids are opaque text here.

- a flow run's links find its runs, and it is dead only when one of them lost its lease and
  none is held by a live lease (a run another process resumed and finished is not "lost");
- settling a cancelled flow run's runs asks the provider once per job that still runs (the
  flow's own SIGTERM path and the worker's hook both settle), counted at the provider;
- the episode report counts accepted, uncollected jobs as committed spend and says how many
  still run.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, update

from episodic.core.runs import INTERRUPTED, Claim
from episodic.core.settings import load_settings
from episodic.core.states import RunState
from episodic.pipeline.admission import dedup_policy
from episodic.pipeline.cancel import settle_cancelled
from episodic.pipeline.check import check_episodes
from episodic.pipeline.gate import EnvironmentCredentials
from episodic.pipeline.report import episode_report
from episodic.pipeline.sweep import sweep
from episodic.providers.base import ImageRequest
from episodic.providers.fake import FakeProvider
from episodic.storage.base import utcnow
from episodic.storage.claims import ClaimStore
from episodic.storage.flow_runs import FlowRunLinks, dead
from episodic.storage.leases import LeaseStore
from episodic.storage.ledger import LedgerStore
from episodic.storage.models import ItemRow, RunRow
from episodic.storage.runs import RunStore
from tests.generation import Episode, new_episode, new_run, provider_log, write_playlist

LONG_AGO = timedelta(days=1)


@pytest.fixture(autouse=True)
def fake_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "provider.jsonl"
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(path))
    monkeypatch.setenv("EPISODIC_FAKE_DELAY_MS", "60000")  # jobs still run at the provider
    return path


@pytest.fixture
def episode(engine: Engine, tmp_path: Path) -> Episode:
    ep = new_episode(engine)
    ep.plan(write_playlist(tmp_path / "pl", ["a", "b", "c"]))
    return ep


def _running_run_with_jobs(episode: Episode, accepted: int) -> tuple[str, list[Claim]]:
    """A running run whose process claimed its first `accepted` items, and the provider
    accepted a job for each (real jobs in the fake's store, still running)."""
    store, claims = RunStore(episode.engine), ClaimStore(episode.engine)
    run_id = new_run(episode)
    store.transition_run(run_id, RunState.RUNNING, lease_s=30)
    provider = FakeProvider(
        profile_id="fake", state_dir=load_settings().home_path / "fake-provider"
    )
    held = []
    for item in store.run_items(run_id)[:accepted]:
        got = claims.claim(item.pk, run_id, "proc:1", lease_s=30, max_attempts=3, profile="fake")
        assert isinstance(got, Claim) and got.submission is not None
        sub = got.submission
        ref = provider.submit(
            ImageRequest(sub.client_reference, "e", item.item_id, item.prompt, item.seed)
        )
        LedgerStore(episode.engine).accept(sub.pk, ref)
        held.append(got)
    return run_id, held


def _expire(engine: Engine, run_id: str) -> None:
    past = utcnow() - timedelta(seconds=5)
    with engine.begin() as conn:
        conn.execute(update(ItemRow).values(lease_expires_at=past))
        conn.execute(update(RunRow).where(RunRow.id == run_id).values(lease_expires_at=past))


def test_a_flow_run_is_dead_only_when_its_run_lost_its_lease(
    episode: Episode, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("EPISODIC_FAKE_DELAY_MS", "0")  # the resume below collects at once
    links = FlowRunLinks(episode.engine)
    run_id, _ = _running_run_with_jobs(episode, accepted=2)
    links.record(run_id, ["generate-1", "weekly-1"])  # a subflow and its parent
    since = utcnow() - LONG_AGO
    found = links.runs_of(["generate-1", "weekly-1", "unknown"], since)
    assert sorted(found) == ["generate-1", "weekly-1"]  # a flow run with no link: left out
    (life,) = found["generate-1"]
    assert (life.run_id, life.episode_id, life.alive, life.accepted_jobs) == (
        run_id,
        episode.episode_id,
        True,
        2,
    )
    assert not dead(found["generate-1"]) and not dead(found["weekly-1"])  # its process lives
    other = new_episode(episode.engine, key="test:2")  # another episode's run and jobs
    other.plan(write_playlist(tmp_path / "other", ["x", "y"]))
    other_run, _ = _running_run_with_jobs(other, accepted=2)
    links.record(other_run, ["generate-2"])
    both = links.runs_of(["generate-1", "generate-2"], since)
    assert [life.accepted_jobs for life in both["generate-1"]] == [2]  # its own jobs only
    assert [(life.run_id, life.unfinished) for life in both["generate-2"]] == [(other_run, 2)]

    _expire(episode.engine, run_id)  # kill -9: nobody renews the lease
    assert dead(links.runs_of(["generate-1"], since)["generate-1"])
    assert sweep(episode.engine, load_settings()).moved["expired_runs"] == [run_id]
    (reaped,) = links.runs_of(["weekly-1"], since)["weekly-1"]
    assert reaped.state == RunState.FAILED and reaped.lost and dead([reaped])
    assert links.runs_of(["weekly-1"], utcnow() + timedelta(minutes=1)) == {}  # before `since`

    assert episode.resume(run_id).state == RunState.COMPLETED  # finished elsewhere
    (done,) = links.runs_of(["generate-1"], since)["generate-1"]
    assert not done.lost and not dead([done]) and done.accepted_jobs == 0


def test_settling_a_cancelled_flow_run_asks_the_provider_once_per_job(episode: Episode) -> None:
    run_id, _ = _running_run_with_jobs(episode, accepted=2)
    settings = load_settings()
    # The flow's process was told to stop (SIGTERM): it gave its items up and paused the run.
    LeaseStore(episode.engine).release_all("proc:1", INTERRUPTED)
    RunStore(episode.engine).transition_run(run_id, RunState.PAUSED, INTERRUPTED)
    red = check_episodes(episode.engine, "weekly", policy=dedup_policy(settings))
    assert any("accepted but never collected" in f.detail for f in red)  # before the cancel
    report = episode_report(
        episode.engine, "weekly", episode.episode_id, prices={"fake": (40_000, "USD")}
    )
    assert (report["accepted"], report["still_running"], report["committed_micros"]) == (
        2,
        2,
        80_000,
    )
    assert report["cost_micros"] == 0  # nothing billed yet: bought, not collected

    first = settle_cancelled(episode.engine, settings, [run_id], EnvironmentCredentials())
    cancels = [e for e in provider_log() if e["event"] == "cancel"]
    assert len(cancels) == 2 and len(first.cancelled) == 2 and first.billing == []
    assert first.runs == {run_id: RunState.CANCELLED}
    text = "\n".join(first.lines())
    assert "cancelled at the provider: 2 jobs" in text and "still billing: none" in text
    assert f"episodic generate {episode.episode_id}" in text

    again = settle_cancelled(episode.engine, settings, [run_id], EnvironmentCredentials())
    assert [e for e in provider_log() if e["event"] == "cancel"] == cancels  # not asked again
    assert again.answers == [] and again.already == 2
    report = episode_report(
        episode.engine, "weekly", episode.episode_id, prices={"fake": (40_000, "USD")}
    )
    assert (report["still_running"], report["cancelled_at_provider"]) == (0, 2)
    findings = check_episodes(episode.engine, "weekly", policy=dedup_policy(settings))
    assert findings == []  # a settled cancel leaves nothing for `check --all` to flag
