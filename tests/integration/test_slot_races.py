"""Deployments asking for one pipeline slot at the same instant, as separate OS
processes released together by a barrier, many trials, on SQLite and Postgres: one episode
per slot, each deployment recorded once, whichever key format a run asks with."""

from __future__ import annotations

from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, select

from episodic.core.keys import slot_key, utc_iso
from episodic.storage.allocator import SLOT_EVENTS, asked_by
from episodic.storage.models import EpisodeEventRow, EpisodeRow
from tests.integration import race_workers as w
from tests.integration import slot_race_workers as sw

pytestmark = pytest.mark.slow
TRIALS = 20
DEPLOYMENTS = ["weekly-episode/weekly", "weekly-episode/copy", "weekly-episode/renamed"]


def test_deployments_racing_for_one_slot_get_one_episode(engine: Engine, database_url: str) -> None:
    start = datetime(2026, 8, 3, 7, tzinfo=UTC)
    slots = [start + timedelta(minutes=n) for n in range(TRIALS)]  # one slot per trial
    plans = [[(slot_key("weekly", s), d) for s in slots] for d in DEPLOYMENTS]
    # A run created before the upgrade, retried after it, asks with its old key.
    plans.append([(f"scheduled:weekly-episode/weekly:{utc_iso(s)}", None) for s in slots])
    answers = w.run_processes([(sw.slot_worker, (database_url, plan)) for plan in plans])
    rows = [row for answer in answers for row in answer]
    assert not [r for r in rows if r[1].startswith("error")], rows
    per_slot: dict[str, set[str]] = defaultdict(set)
    created: Counter[str] = Counter()
    for (_key, episode_id, was_created), slot in zip(rows, slots * len(plans), strict=True):
        per_slot[utc_iso(slot)].add(episode_id)
        created[utc_iso(slot)] += was_created
    assert all(len(ids) == 1 for ids in per_slot.values()), per_slot  # one episode per slot
    assert set(created.values()) == {1}  # created once, found by the others
    with engine.connect() as conn:
        keys = dict(conn.execute(select(EpisodeRow.id, EpisodeRow.allocation_key)).all())
        events = conn.execute(
            select(EpisodeEventRow.episode_pk, EpisodeEventRow.detail).where(
                EpisodeEventRow.kind.in_(SLOT_EVENTS)
            )
        ).all()
    assert len(keys) == TRIALS
    details: dict[int, list[dict[str, str]]] = defaultdict(list)
    for pk, detail in events:
        details[pk].append(detail)
    for pk, key in keys.items():
        recorded = Counter(d["scheduled_by"] for d in details[pk] if d.get("scheduled_by"))
        assert set(recorded.values()) <= {1}, recorded  # each deployment recorded once
        assert asked_by(key, details[pk]) == set(DEPLOYMENTS), (key, details[pk])
