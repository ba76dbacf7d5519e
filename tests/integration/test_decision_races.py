"""Of two decisions at the same instant, one wins, visibly.

Real OS processes released together by a barrier, many trials, SQLite and Postgres. Before,
the loser of the compare-and-set answered "already approved" (exit 0) whenever the decision
matched, without comparing picks: `approve --pick v01=2` against `--pick v01=3` both
succeeded in some trials and the loser's pick was silently not shipped.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest
from sqlalchemy import Engine, select

from episodic.core.ids import WeekId
from episodic.pipeline.allocation import allocate
from episodic.storage.approvals import ApprovalStore
from episodic.storage.episodes import EpisodeRepository
from episodic.storage.models import ApprovalRow, EpisodeRow
from tests.generation import Episode, write_playlist
from tests.integration import race_workers as w
from tests.integration.decision_race_workers import pick_worker

pytestmark = pytest.mark.slow
TRIALS = 20


@pytest.fixture(autouse=True)
def fake_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))


def _hero_episodes(engine: Engine, tmp_path: Path) -> list[str]:
    """TRIALS generated episodes, each with one hero video of 3 candidates."""
    ids = []
    for n in range(TRIALS):
        allocation = allocate(engine, "weekly", WeekId.parse("2026-W32"), f"pick:{n}")
        episode = Episode(engine, str(allocation.episode.episode_id))
        episode.plan(write_playlist(tmp_path / f"p{n}", [f"e{n}"], hero={1: 3}))
        assert episode.generate().exit_code == 0
        ids.append(episode.episode_id)
    return ids


@pytest.mark.parametrize(
    "bob",
    [("approve", {"v01": 3}), ("reject", None)],
    ids=["other-picks", "reject"],
)
def test_of_two_different_decisions_one_is_recorded_and_the_other_refused_naming_it(
    engine: Engine, database_url: str, tmp_path: Path, bob: tuple[str, dict[str, int] | None]
) -> None:
    ids = _hero_episodes(engine, tmp_path)
    targets = [
        (pick_worker, (database_url, ids, "ann", "approve", {"v01": 2})),
        (pick_worker, (database_url, ids, "bob", *bob)),
    ]
    answers = w.run_processes(targets)
    rows = [row for answer in answers for row in answer]
    assert not [r for r in rows if r[1] == "error"], rows
    by_episode: dict[str, list[list[str]]] = defaultdict(list)
    for row in rows:
        by_episode[row[0]].append(row)
    reviews = ApprovalStore(engine)
    episodes = EpisodeRepository(engine)
    for episode_id, pair in by_episode.items():
        assert sorted(r[1] for r in pair) == ["recorded", "refused"], pair  # never two wins
        (loser,) = [r for r in pair if r[1] == "refused"]
        pk = episodes.episode_pk("weekly", episode_id)
        (decision,) = reviews.approvals(pk)
        assert decision["by"] in loser[2] and decision["decision"] in loser[2], loser  # named
        if decision["decision"] == "approved":
            picks = reviews.approved_picks(pk)
            assert picks in ({"v01": 2}, {"v01": 3})
            shown = ",".join(f"{v}={n}" for v, n in picks.items())
            assert shown in loser[2], loser
    with engine.connect() as conn:
        approvals = conn.execute(select(ApprovalRow.episode_pk)).scalars().all()
        states = set(conn.execute(select(EpisodeRow.state)).scalars())
    assert len(approvals) == len(set(approvals)) == TRIALS  # one decision per episode
    assert states <= {"approved", "rejected"}


def test_two_equal_approvals_at_once_are_one_decision_and_an_idempotent_success(
    engine: Engine, database_url: str, tmp_path: Path
) -> None:
    ids = _hero_episodes(engine, tmp_path)
    targets = [
        (pick_worker, (database_url, ids, "ann", "approve", {"v01": 2})),
        (pick_worker, (database_url, ids, "bob", "approve", {"v01": 2})),
    ]
    rows = [row for answer in w.run_processes(targets) for row in answer]
    assert not [r for r in rows if r[1] == "error"], rows
    by_episode: dict[str, list[str]] = defaultdict(list)
    for episode_id, outcome, _ in rows:
        by_episode[episode_id].append(outcome)
    assert all(sorted(v) == ["no-op", "recorded"] for v in by_episode.values()), by_episode
    with engine.connect() as conn:
        approvals = conn.execute(select(ApprovalRow.episode_pk)).scalars().all()
    assert len(approvals) == len(set(approvals)) == TRIALS
