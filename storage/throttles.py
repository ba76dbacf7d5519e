"""A provider's throttle, shared by every process of an installation (`ProviderThrottleRow`).

When a provider refuses a create for now (429, or 503 with ``Retry-After``), the worker that
heard it records the moment the provider said to come back (`ThrottleStore.hold`); every claim
of a new paid call of that profile, in any run, process or machine, is refused ``throttled``
until then (`storage.claims` reads it in the claim's own transaction), and the executors wait
and ask again (`episodic.pipeline.item_dispatch`). So four workers on one account hear one
429, not four each. The moment is the provider's own (`pipeline.throttle` bounds it at a
day), however far past the bound one wait is held for: a claim that meets a hold past that
bound pauses its run instead of waiting (`episodic.pipeline.item_claims`), so no process
sends a create inside the window the provider asked for. A hold only ever moves later (two
workers told different moments keep the later one), and a hold whose moment has passed holds
nothing.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, Table, case, select
from sqlalchemy.dialects import postgresql, sqlite

from episodic.storage import dbapi, tx
from episodic.storage.base import utcnow
from episodic.storage.dbapi import DriverSQL
from episodic.storage.models import ProviderThrottleRow
from episodic.storage.tx import idempotent, retry_outages

_throttles: Table = ProviderThrottleRow.__table__  # type: ignore[assignment]


def held_until(conn: Connection, profile: str, now: datetime) -> datetime | None:
    """The moment `profile` may be sent a new paid call again, if that is after `now`."""
    found = conn.execute(
        select(_throttles.c.not_before).where(_throttles.c.profile == profile)
    ).scalar_one_or_none()
    return found if found is not None and found > now else None


# When the provider last said the profile may be sent a new paid call again.
_THROTTLED_UNTIL = DriverSQL("SELECT not_before FROM provider_throttles WHERE profile = :b_profile")


class ClaimThrottle:
    """The profile's throttle as a claim transaction sees it (`storage.claims`): read on the
    bare driver, once, at the transaction's first new paid call."""

    def __init__(self, conn: Connection, profile: str, now: datetime) -> None:
        self.conn, self.profile, self.now = conn, profile, now
        self._held: bool | None = None
        self.until: datetime | None = None  # when held: the moment it ends

    def held(self) -> bool:
        if self._held is None:
            found = dbapi.fetch_one(self.conn, _THROTTLED_UNTIL, {"b_profile": self.profile})
            self.given((None if found is None else found[0],))
        assert self._held is not None
        return self._held

    def part(self) -> dbapi.Part:
        """`held`'s read as a part of the claim's one read (`dbapi.fetch_parts`): the moment,
        or NULL."""
        return dbapi.Part(f"SELECT ({_THROTTLED_UNTIL.sqlite})", {"b_profile": self.profile}, 1)

    def given(self, row: tuple[Any, ...]) -> None:
        """The answer of `part` (or of `held`'s own read): the throttle's moment, or None."""
        until = dbapi.moment(row[0])
        self._held = until is not None and until > self.now
        self.until = until if self._held else None


@retry_outages
class ThrottleStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @idempotent
    def hold(self, profile: str, until: datetime, detail: str) -> datetime:
        """No new paid call of `profile` is claimed before `until` (or a later moment already
        recorded); returns the moment recorded. Idempotent: a retry writes the same."""
        now = utcnow()
        values = {
            "profile": profile,
            "not_before": until,
            "detail": detail[:500],
            "updated_at": now,
        }
        with tx.write(self.engine) as conn:
            dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
            statement = dialect.insert(_throttles).values(**values)
            later = case(
                (
                    statement.excluded.not_before > _throttles.c.not_before,
                    statement.excluded.not_before,
                ),
                else_=_throttles.c.not_before,
            )
            conn.execute(
                statement.on_conflict_do_update(
                    index_elements=[_throttles.c.profile],
                    set_={
                        "not_before": later,
                        # the words that go with the moment kept
                        "detail": case(
                            (
                                statement.excluded.not_before > _throttles.c.not_before,
                                statement.excluded.detail,
                            ),
                            else_=_throttles.c.detail,
                        ),
                        "updated_at": now,
                    },
                )
            )
            recorded: datetime = conn.execute(
                select(_throttles.c.not_before).where(_throttles.c.profile == profile)
            ).scalar_one()
        return recorded

    def holding(self, profile: str) -> tuple[datetime, str] | None:
        """When `profile` may be sent a new paid call again and the provider's words that
        said so, if that moment is still to come."""
        with tx.read(self.engine) as conn:
            found = conn.execute(
                select(_throttles.c.not_before, _throttles.c.detail).where(
                    _throttles.c.profile == profile
                )
            ).first()
        if found is None or found.not_before <= utcnow():
            return None
        return found.not_before, found.detail or ""

    def held_until(self, profile: str) -> datetime | None:
        """When `profile` may be sent a new paid call again, if that is still to come."""
        with tx.read(self.engine) as conn:
            return held_until(conn, profile, utcnow())
