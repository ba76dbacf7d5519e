"""Schedule slots and their ISO weeks.

A schedule slot is one moment a pipeline's schedule runs: the scheduled start of a flow run
the scheduler created (a whole second), named by its allocation key
``slot:{pipeline}:{start in UTC}`` (`episodic.core.keys.slot_key`). Its week is the ISO week
of that moment on a wall clock in the pipeline's timezone, so a Monday 00:30 slot in Berlin
belongs to Monday's week whatever the UTC date. (Not a provider slot: the jobs a provider
profile has in flight are `episodic.storage.slots`.)

Every caller that turns a slot, a moment or a stated week into the week of an allocation uses
`allocation_week`; the timezone is passed in (the pipeline's recorded one).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, time, tzinfo

from episodic.core.errors import InvalidInput, NoInvocationIdentity
from episodic.core.ids import WeekId
from episodic.core.keys import SlotKey


def slot_week(moment: datetime, tz: tzinfo) -> WeekId:
    """The ISO week of `moment` on a wall clock in `tz` (a naive moment: `InvalidWeekId`)."""
    return WeekId.of(moment, tz)


def week_start(week: WeekId, tz: tzinfo) -> datetime:
    """Monday 00:00 of `week` on a wall clock in `tz`: the first moment whose slot is in it."""
    return datetime.combine(week.monday(), time(0), tz)


def week_window(week: WeekId, tz: tzinfo) -> tuple[datetime, datetime]:
    """The moments whose slots fall in `week` in `tz`: from its Monday 00:00 up to, not
    including, the next Monday 00:00 (wall clock: a DST change makes it 167 or 169 hours)."""
    return week_start(week, tz), week_start(week.next(), tz)


@dataclass(frozen=True, slots=True)
class AllocationWeek:
    """The week an allocation is for, and the slot (or moment) it was read from on the
    pipeline's wall clock; `moment` is None when the week was stated outright."""

    week: WeekId
    moment: datetime | None


def allocation_week(
    key: str,
    tz: tzinfo,
    *,
    stated: WeekId | None = None,
    moment: datetime | None = None,
    key_name: str = "allocation key",
) -> AllocationWeek:
    """The week `key` allocates in, in `tz`: a slot key's own week (a `stated` week that is
    another is refused: the slot's own run would look in its week and not find it); else the
    `stated` week; else the week of `moment` (a manual run's start). Raises `InvalidInput`
    (a slot key and another week, naming the key as `key_name`) and `NoInvocationIdentity`
    (neither a slot key, a stated week nor a moment)."""
    named = SlotKey.parse(key)
    if named is not None:
        slot = named.moment.astimezone(tz)
        week = slot_week(slot, tz)
        if stated is not None and stated != week:
            raise InvalidInput(f"{key_name} {key} names a slot of {week} in {tz}, not of {stated}")
        return AllocationWeek(week, slot)
    if stated is not None:
        return AllocationWeek(stated, None)
    if moment is not None:
        local = moment.astimezone(tz)
        return AllocationWeek(slot_week(local, tz), local)
    raise NoInvocationIdentity("no scheduled time to take the week from: pass `week`")


def in_week(moment: datetime, week: WeekId, tz: tzinfo) -> bool:
    """Whether a slot at `moment` belongs to `week` in `tz`."""
    return slot_week(moment, tz) == week
