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
    f"SELECT id AS item FROM items WHERE claim_profile = :b_profile AND {predicates.LIVE_CLAIM_SQL}"
)
_HOLDERS = DriverSQL(_RUNNING_SLOTS)
_HOLDERS_WITH_JOBS = DriverSQL(
    f"{_RUNNING_SLOTS} UNION SELECT item_pk AS item FROM submissions WHERE provider_profile = "
    f":b_profile AND {predicates.OPEN_SQL} AND created_at > :b_since"
)


class ClaimSlots:
    """The slots of a provider profile as one claim transaction sees them.

    The items holding one are read once, at the transaction's first question (under the
    profile's lock, which every claim of a new paid call of it takes), then kept up to date
    as the transaction takes items (`took`). Meanwhile other transactions only free slots
    (a completion, a lease running out), never take one, so the count a claim decides by is
    never below the truth: the limit is never passed, and a slot freed meanwhile is seen by
    the next transaction. `max_job_s` (seconds): an open submission of the profile made
    within it holds its item's slot too (None: only running items count)."""

    def __init__(
        self, conn: Connection, profile: str, now: datetime, max_job_s: float | None
    ) -> None:
        self.conn, self.profile, self.now, self.max_job_s = conn, profile, now, max_job_s
        self._holders: set[int] | None = None

    def _read(self) -> tuple[DriverSQL, dict[str, Any]]:
        params: dict[str, Any] = {"b_profile": self.profile, "b_now": self.now}
        if self.max_job_s is None:
            return _HOLDERS, params
        params["b_since"] = self.now - timedelta(seconds=self.max_job_s)
        return _HOLDERS_WITH_JOBS, params

    def taken_by_others(self, item_pk: int) -> int:
        """The slots of the profile taken by other items than `item_pk`."""
        if self._holders is None:
            statement, params = self._read()
            self._holders = {int(row[0]) for row in dbapi.fetch_all(self.conn, statement, params)}
        return len(self._holders - {item_pk})

    def part(self) -> dbapi.Part:
        """The holders' read as a part of the claim's one read (PostgreSQL, `dbapi.
        fetch_parts`): their ids as one array (NULL for none)."""
        statement, params = self._read()
        return dbapi.Part(f"SELECT array_agg(h.item) FROM ({statement.sqlite}) h", params, 1)

    def given(self, row: tuple[Any, ...]) -> None:
        """The answer of `part`."""
        self._holders = {int(pk) for pk in row[0] or ()}

    def took(self, item_pk: int) -> None:
        """The transaction took `item_pk` for the profile: it holds a slot from now on."""
        if self._holders is not None:
            self._holders.add(item_pk)
