"""The forms of one shared rule agree (storage/statements.py's shared predicates), on both
backends: a rule the paid path's hand-written SQL needs has a text form beside its Core
form, and a rule evaluated on rows in memory a Python form (`episodic.core.runs.claim_live`); each
must select exactly the rows the others select.

- an item held by a live claim: `held_by_live_claim` (Core), `LIVE_CLAIM_SQL` (driver text)
  and `claim_live` (Python), over every state a claim meets times a lease that is missing,
  past, exactly now and future; the Core form's negation is exactly the other rows (a
  running item without a lease included: the collectible items' query relies on it);
- the newest plan: `newest_plan` (Core), `newest_plan_sql` (driver text) and the plan read
  that loads it, for an episode planned twice and one never planned.
"""

from __future__ import annotations

import itertools
from datetime import timedelta
from pathlib import Path

from sqlalchemy import Engine, Table, select, update

from episodic.core.runs import claim_live
from episodic.storage import dbapi, predicates
from episodic.storage.base import utcnow
from episodic.storage.dbapi import DriverSQL
from episodic.storage.models import EpisodeRow, ItemRow
from episodic.storage.plans import newest_plan
from tests.generation import new_episode, new_run, write_playlist

_items: Table = ItemRow.__table__  # type: ignore[assignment]
_episodes: Table = EpisodeRow.__table__  # type: ignore[assignment]

STATES = ["running", "failed", "pending", "completed"]


def test_the_forms_of_a_live_claim_select_the_same_items(engine: Engine, tmp_path: Path) -> None:
    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "pl", [f"t{n}" for n in range(16)]))
    new_run(episode)  # the items
    now = utcnow()
    leases = [None, now - timedelta(seconds=1), now, now + timedelta(seconds=1)]
    grid = list(itertools.product(STATES, leases))
    with engine.begin() as conn:
        pks = list(conn.execute(select(_items.c.id).order_by(_items.c.id)).scalars())
        assert len(pks) >= len(grid)
        pks = pks[: len(grid)]
        for pk, (state, lease) in zip(pks, grid, strict=True):
            conn.execute(
                update(_items).where(_items.c.id == pk).values(state=state, lease_expires_at=lease)
            )
    with engine.connect() as conn:
        core = set(
            conn.execute(
                select(_items.c.id).where(_items.c.id.in_(pks), predicates.held_by_live_claim(now))
            ).scalars()
        )
        negated = set(
            conn.execute(
                select(_items.c.id).where(_items.c.id.in_(pks), ~predicates.held_by_live_claim(now))
            ).scalars()
        )
        text = {
            int(row[0])
            for row in dbapi.fetch_all(
                conn,
                DriverSQL(f"SELECT id FROM items WHERE {predicates.LIVE_CLAIM_SQL}"),
                {"b_now": now},
            )
        }
        rows = conn.execute(
            select(_items.c.id, _items.c.state, _items.c.lease_expires_at).where(
                _items.c.id.in_(pks)
            )
        ).all()
    python = {row.id for row in rows if claim_live(row.state, row.lease_expires_at, now)}
    expected = {pk for pk, (state, lease) in zip(pks, grid, strict=True) if state == "running"}
    expected &= {pk for pk, (_, lease) in zip(pks, grid, strict=True) if lease == leases[3]}
    assert len(expected) == 1  # running under the future lease, and only that one
    assert core == text == python == expected
    assert negated == set(pks) - expected


def test_the_forms_of_the_newest_plan_name_the_same_plan(engine: Engine, tmp_path: Path) -> None:
    planned = new_episode(engine)
    planned.plan(write_playlist(tmp_path / "one", ["a"]))
    planned.plan(write_playlist(tmp_path / "two", ["a", "b"]))
    unplanned = new_episode(engine, key="test:2")
    newest_sql = DriverSQL(f"SELECT {predicates.newest_plan_sql(':b_episode')}")
    found = {}
    with engine.connect() as conn:
        for episode in (planned, unplanned):
            pk = conn.execute(
                select(_episodes.c.id).where(_episodes.c.episode_id == episode.episode_id)
            ).scalar_one()
            loaded = newest_plan(conn, pk)
            text = dbapi.scalar(conn, newest_sql, {"b_episode": pk})
            found[episode.episode_id] = (
                predicates.newest_plan_id(conn, pk),
                None if text is None else int(text),
                None if loaded is None else loaded[0],
                len(loaded[1]["items"]) if loaded is not None else None,
            )
    newest = found[planned.episode_id][0]
    assert newest is not None
    assert found[planned.episode_id] == (newest, newest, newest, 2)  # the second plan
    assert found[unplanned.episode_id] == (None, None, None, None)
