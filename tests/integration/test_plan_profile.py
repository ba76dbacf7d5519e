"""Every planner refuses a playlist whose provider profile does not exist, at
plan time and naming the known ones, not first at `generate`: the weekly flow's plan step
(its task's function, without a Prefect server) and the Python API. Both backends."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine

from episodic.core.errors import InvalidPlaylist
from episodic.core.ids import WeekId
from episodic.pipeline.allocation import allocate
from episodic.pipeline.episode_plan import record_plan, recorded_plan_summary
from tests.generation import write_playlist


def test_the_weekly_flows_plan_step_refuses_an_unknown_profile(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from episodic.tasks.plan import plan_episode

    (tmp_path / "providers.yaml").write_text(
        "profiles:\n  mine:\n    kind: fake\n    cost_per_image_minor: 4\n"
    )
    monkeypatch.setenv("EPISODIC_PROVIDERS_FILE", str(tmp_path / "providers.yaml"))
    episode = str(allocate(engine, "weekly", WeekId.parse("2026-W32"), "k").episode.episode_id)
    playlist = write_playlist(tmp_path / "pl", ["a"], profile="mien")
    with pytest.raises(
        InvalidPlaylist, match=r"'mien' is not a provider profile \(known: fake, mine;"
    ):
        plan_episode.fn("weekly", episode, str(playlist))
    with pytest.raises(InvalidPlaylist, match="'mien'"):
        record_plan(engine, "weekly", episode, playlist, providers_path=None)
    assert recorded_plan_summary(engine, "weekly", episode) is None  # nothing recorded
    known = write_playlist(tmp_path / "ok", ["a"], profile="mine")
    assert plan_episode.fn("weekly", episode, str(known))["provider_profile"] == "mine"
