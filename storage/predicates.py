"""The rules that queries decide by, each written once: which submissions are open, which
items are held by a live claim, which runs are alive or expired, an episode's newest plan,
what no live run includes. `episodic.storage.statements` (the statements that move states)
and the stores compose their guards and reads from these.

A rule the paid path's hand-written SQL needs has its text form beside the Core one, and a
rule evaluated on rows in memory its Python form (`episodic.core.runs.claim_live`, below
`core`'s layer); `tests/integration/test_predicates.py` checks on both backends that the
forms agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Select,
    Table,
    and_,
    func,
    or_,
    select,
)

from episodic.core.states import (
    LIVE_RUN_STATES,
    OPEN_SUBMISSION_STATES,
    UNSETTLED_SUBMISSION_STATES,
    ItemState,
    RunState,
)
from episodic.storage import models
from episodic.storage.dbapi import states_sql

_plans: Table = models.EpisodePlanRow.__table__  # type: ignore[assignment]
_runs: Table = models.RunRow.__table__  # type: ignore[assignment]
_items: Table = models.ItemRow.__table__  # type: ignore[assignment]
_members: Table = models.RunItemRow.__table__  # type: ignore[assignment]
_subs: Table = models.SubmissionRow.__table__  # type: ignore[assignment]

OPEN = [s.value for s in OPEN_SUBMISSION_STATES]
UNSETTLED = [s.value for s in UNSETTLED_SUBMISSION_STATES]
OPEN_SQL = states_sql(OPEN)
UNSETTLED_SQL = states_sql(UNSETTLED)

# An item held by a live claim, in hand-written SQL (`ClaimStore.claim`'s slot count, the
# proof before a paid call): the item runs under a lease that is live at ``:b_now``.
LIVE_CLAIM_SQL = "state = 'running' AND lease_expires_at > :b_now"


def held_by_live_claim(now: datetime) -> ColumnElement[bool]:
    """An item running under a lease live at `now`: `core.runs.claim_live` in SQL. Never NULL
    (no lease: not held), so its negation (``~``) is exactly the items no live claim holds."""
    return and_(
        _items.c.state == ItemState.RUNNING,
        _items.c.lease_expires_at.is_not(None),
        _items.c.lease_expires_at > now,
    )


def lease_expired(now: datetime) -> ColumnElement[bool]:
    """A running item whose lease ran out before `now` (or none was recorded): reapable. (A
    lease ending exactly at `now` is neither held nor expired: the next sweep reaps it.)"""
    return and_(
        _items.c.state == ItemState.RUNNING,
        or_(_items.c.lease_expires_at < now, _items.c.lease_expires_at.is_(None)),
    )


def run_alive(now: datetime, fallback_lease_s: float) -> ColumnElement[bool]:
    """A running run's lease is live: renewed by a heartbeat, or (no lease recorded) its
    latest sign of life ``COALESCE(heartbeat_at, started_at, created_at)`` is recent."""
    return or_(
        _runs.c.lease_expires_at >= now,
        and_(
            _runs.c.lease_expires_at.is_(None),
            func.coalesce(_runs.c.heartbeat_at, _runs.c.started_at, _runs.c.created_at)
            >= now - timedelta(seconds=fallback_lease_s),
        ),
    )


def live_run(now: datetime, fallback_lease_s: float) -> ColumnElement[bool]:
    """A running run some process still works on (`run_alive`)."""
    return and_(_runs.c.state == RunState.RUNNING, run_alive(now, fallback_lease_s))


def expired_run(now: datetime, fallback_lease_s: float) -> ColumnElement[bool]:
    """A running run no process renews any more (`run_alive` is false): the sweep fails it."""
    return and_(_runs.c.state == RunState.RUNNING, ~run_alive(now, fallback_lease_s))


def pending_expired(now: datetime, pending_ttl_s: float) -> ColumnElement[bool]:
    """A run created over `pending_ttl_s` seconds before `now`: one still pending never started
    in time (the sweep cancels it; ``~`` is a pending run still admissible for dedup)."""
    return _runs.c.created_at < now - timedelta(seconds=pending_ttl_s)


def newest_plan(episode_pk: Any) -> Select[tuple[Any]]:
    """The id of the episode's newest plan (highest id; NULL: none), as a query or, with
    ``.scalar_subquery()``, a value in another statement (never correlated to it)."""
    return select(func.max(_plans.c.id)).where(_plans.c.episode_pk == episode_pk).correlate(None)


def newest_plan_sql(episode_pk: str) -> str:
    """`newest_plan` in hand-written SQL, for the episode whose pk is the SQL `episode_pk`."""
    return f"(SELECT max(p.id) FROM episode_plans p WHERE p.episode_pk = {episode_pk})"


def newest_plan_id(conn: Connection, episode_pk: int) -> int | None:
    """The id of the episode's newest recorded plan (None: none)."""
    newest = conn.execute(newest_plan(episode_pk)).scalar()
    return None if newest is None else int(newest)


def live_memberships(excluding: Sequence[str] = ()) -> Select[tuple[str, int]]:
    """(run_id, item_pk) of every live run but those in `excluding`: they keep items alive."""
    query = (
        select(_members.c.run_id, _members.c.item_pk)
        .join(_runs, _runs.c.id == _members.c.run_id)
        .where(_runs.c.state.in_(LIVE_RUN_STATES))
    )
    return query.where(_members.c.run_id.not_in(list(excluding))) if excluding else query


def orphaned_pending(candidates: Select[Any], excluding: Sequence[str] = ()) -> ColumnElement[bool]:
    """The pending items among `candidates` (item pks) no live run but `excluding` (runs
    cancelled or failed in the same transaction) includes: nothing will run them."""
    return and_(
        _items.c.id.in_(candidates),
        _items.c.id.not_in(select(live_memberships(excluding).subquery().c.item_pk)),
        _items.c.state == ItemState.PENDING,
    )
