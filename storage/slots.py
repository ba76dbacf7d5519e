"""Provider slots: how many jobs of a provider profile are in flight, as a claim counts them
against the profile's ``max_concurrency`` (`episodic.storage.claims.ClaimStore.claim`).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection

from episodic.storage import dbapi, predicates
from episodic.storage.dbapi import DriverSQL

# The slots a profile's jobs take: its items running under a live lease, and the items with
# an open submission of the profile made within its `max_job_s` (a job the provider accepted
# runs there whatever became of the claim that sent it: an interrupted or killed holder, a
# job left for later collection). An item with both counts once.
_RUNNING_SLOTS = (
    "SELECT id AS item FROM items WHERE claim_profile = :b_profile AND "
    f"{predicates.LIVE_CLAIM_SQL} AND id != :b_item"
)
_IN_FLIGHT = DriverSQL(f"SELECT count(*) FROM ({_RUNNING_SLOTS}) AS slots")
_IN_FLIGHT_WITH_JOBS = DriverSQL(
    f"SELECT count(*) FROM ({_RUNNING_SLOTS} UNION SELECT item_pk AS item FROM submissions "
    f"WHERE provider_profile = :b_profile AND {predicates.OPEN_SQL} AND created_at > :b_since "
    "AND item_pk != :b_item) AS slots"
)


def in_flight(
    conn: Connection, profile: str, item_pk: int, now: datetime, max_job_s: float | None
) -> int:
    """The slots of `profile` taken by other items than `item_pk`: those running under a
    live lease and, with `max_job_s` (seconds), those with an open submission of `profile`
    made less than `max_job_s` before `now`."""
    params: dict[str, Any] = {"b_profile": profile, "b_now": now, "b_item": item_pk}
    if max_job_s is None:
        return int(dbapi.scalar(conn, _IN_FLIGHT, params))
    params["b_since"] = now - timedelta(seconds=max_job_s)
    return int(dbapi.scalar(conn, _IN_FLIGHT_WITH_JOBS, params))
