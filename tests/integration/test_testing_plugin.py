"""The pytest plugin a team tests its own pipeline with (`episodic.testing`), as a team's
test uses it: a week through the command line, its jobs counted in the fake provider's own
log, a bad week rehearsed, on the embedded SQLite database and on PostgreSQL."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from episodic.core.resources import example_playlist
from episodic.testing import fake_jobs
from episodic.testing.fake_jobs import FakeJobs, with_faults
from episodic.testing.sandbox import CommandFailed, Sandbox

PLAYLIST = example_playlist()  # 12 videos, 14 images of the built-in fake (0.04 USD each)


def _whole_week(sandbox: Sandbox) -> None:
    week = sandbox.plan(PLAYLIST, week="2026-W32")
    assert week.images == 14
    assert week.generate(max_cost="0.60")["completed"] == 14
    assert week.approve(by="reviewer")["state"] == "approved"
    assert week.assemble()["state"] == "assembled"
    assert week.state() == "assembled"
    assert week.spend() == {"USD": Decimal("0.56")} == sandbox.spend()
    assert week.billed() == Decimal("0.56")
    made = week.jobs_per_item()
    assert len(made) == 14 and set(made.values()) == {1}


def test_a_week_on_the_embedded_default(episodic_sandbox: Sandbox) -> None:
    _whole_week(episodic_sandbox)
    assert (episodic_sandbox.home / "episodic.db").is_file()


def test_a_week_on_postgresql(episodic_sandbox: Sandbox, episodic_postgres: str) -> None:
    assert episodic_postgres.startswith("postgresql+psycopg://")
    _whole_week(episodic_sandbox)
    assert not (episodic_sandbox.home / "episodic.db").exists()


def test_the_same_key_is_the_same_episode_and_buys_nothing_again(
    episodic_sandbox: Sandbox, episodic_fake: FakeJobs
) -> None:
    first = episodic_sandbox.plan(PLAYLIST, week="2026-W32", key="run:monday")
    first.generate()
    again = episodic_sandbox.plan(PLAYLIST, week="2026-W32", key="run:monday")
    assert again.episode_id == first.episode_id
    again.generate()
    assert episodic_fake.jobs() == 14
    other = episodic_sandbox.plan(PLAYLIST, week="2026-W32")
    assert other.episode_id == "2026-W32-1"


def test_a_bad_week_is_rehearsed_and_each_image_is_bought_once(
    episodic_sandbox: Sandbox, episodic_fake: FakeJobs
) -> None:
    faults = {"v02": fake_jobs.LOST_REPLY, "v04": fake_jobs.unavailable(2)}
    faults["v05"] = fake_jobs.REFUSED
    week = episodic_sandbox.plan(PLAYLIST, week="2026-W33", faults=faults)
    assert week.generate(expect=[6])["failed"] == 1
    week.generate(expect=[6])
    made = episodic_fake.jobs_per_item(week.episode_id)
    assert made["v02.p1"] == 1 and made["v04.p1"] == 1 and "v05.p1" not in made
    calls = [e["item_id"] for e in episodic_fake.events("submit")]
    assert calls.count("v04.p1") == 3  # two outages, then the job
    assert calls.count("v05.p1") == 2  # refused in each run, never made
    with pytest.raises(CommandFailed, match=r"episodic approve .* exited 2: error: "):
        week.approve(by="reviewer")  # not every image was generated


def test_faults_need_the_title_in_the_prompt_and_a_real_video(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no video v99"):
        with_faults(PLAYLIST, {"v99": fake_jobs.REFUSED}, tmp_path / "a" / "p.yaml")
    untitled = tmp_path / "untitled.yaml"
    untitled.write_text(PLAYLIST.read_text().replace("'{title}'", "'a video'"))
    with pytest.raises(ValueError, match=r"has no \{title\}"):
        with_faults(untitled, {"v01": fake_jobs.REFUSED}, tmp_path / "b" / "p.yaml")
    with pytest.raises(ValueError, match="times must be"):
        fake_jobs.unavailable(0)


def test_a_sandbox_changes_the_environment_only_while_a_command_runs(
    episodic_sandbox: Sandbox, tmp_path: Path
) -> None:
    import os

    before = os.environ.get("EPISODIC_HOME")
    episodic_sandbox.plan(PLAYLIST, week="2026-W32")
    assert os.environ.get("EPISODIC_HOME") == before
    with episodic_sandbox.with_environment():
        assert os.environ["EPISODIC_HOME"] == str(episodic_sandbox.home)
    other = Sandbox(tmp_path / "other")
    assert other.episodes() == []  # a second installation in the same test is its own
    assert episodic_sandbox.episodes() == ["2026-W32-0"]


def test_a_sandbox_never_writes_into_the_shells_media_store(
    episodic_sandbox: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shells = tmp_path / "the-teams-real-store"
    shells.mkdir()
    monkeypatch.setenv("EPISODIC_MEDIA_URL", str(shells))
    episodic_sandbox.plan(PLAYLIST, week="2026-W32").generate()
    assert list(shells.iterdir()) == []
    assert any((episodic_sandbox.home / "media").rglob("*.png"))
