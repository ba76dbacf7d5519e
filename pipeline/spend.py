"""`episodic spend`: what the ledger says was spent, grouped, exactly.

Each paid call is dated by its submission's ``created_at`` in its pipeline's timezone, by
`episodic.core.periods` (the rule the period budgets use, so the report and the budgets agree): a
week is an ISO week (``2026-W49``), a month a calendar month (``2026-12``). ``--since`` is
inclusive and ``--until`` is inclusive too (the whole day), both dates in the pipeline's
timezone. Currencies are never summed: a group with calls in two currencies is two rows.

Per group and currency: the billed calls (cost entries) and their exact total, and what is
in flight (open submissions, at what each was reserved at). The totals per currency are
the sums of the groups' rows, which are the sums of the ledger's rows (`check` verifies
them against the ledger's own SQL aggregate).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import Engine

from episodic.core.errors import InvalidInput
from episodic.core.ids import WeekId, shown
from episodic.core.money import amount_text
from episodic.core.periods import day_start, period_label
from episodic.core.settings import load_timezone, validate_pipeline
from episodic.storage.spend import SpendLine, known_pipelines, spend_lines

GROUPINGS = ("week", "month", "episode", "profile", "pipeline")
_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")


def parse_day(text: str | None, what: str) -> date | None:
    """A YYYY-MM-DD date (ASCII digits, a real day), or `InvalidInput` naming `what`."""
    if text is None:
        return None
    try:
        if isinstance(text, str) and _DATE.fullmatch(text):
            return date.fromisoformat(text)
    except ValueError:
        pass
    raise InvalidInput(f"invalid {what} {shown(text)}: expected a date YYYY-MM-DD, e.g. 2026-12-01")


def check_grouping(by: str) -> str:
    if by not in GROUPINGS:
        expected = ", ".join(GROUPINGS)
        raise InvalidInput(f"unknown --group-by {shown(by)}: expected one of {expected}")
    return by


def _bound(day: date | None, tz: ZoneInfo) -> datetime | None:
    """The first instant of `day` in `tz` as a bound, or None (no bound) for no day or a
    day at the calendar's edge (9999-12-31, 0001-01-01) whose instant is not representable:
    every recorded call is inside such a bound anyway."""
    if day is None:
        return None
    try:
        return day_start(day, tz)
    except OverflowError:
        return None


def check_window(since: date | None, until: date | None) -> None:
    if since is not None and until is not None and since > until:
        raise InvalidInput(f"--since {since} is after --until {until}: nothing could match")


@dataclass
class Figures:
    """One row's figures, in micro-units of one currency."""

    calls: int = 0
    spent_micros: int = 0
    in_flight_calls: int = 0
    in_flight_micros: int = 0

    def add(self, line: SpendLine) -> None:
        if line.billed:
            self.calls += 1
            self.spent_micros += line.amount_micros
        else:
            self.in_flight_calls += 1
            self.in_flight_micros += line.reserved_micros

    def to_dict(self, currency: str) -> dict[str, Any]:
        return {
            "currency": currency,
            "calls": self.calls,
            "spent_micros": self.spent_micros,
            "spent": amount_text(self.spent_micros),
            "in_flight_calls": self.in_flight_calls,
            "in_flight_micros": self.in_flight_micros,
            "in_flight": amount_text(self.in_flight_micros),
        }


@dataclass
class Pipelines:
    """The pipelines a report covers, with the timezone each dates its calls in."""

    zones: dict[str, ZoneInfo] = field(default_factory=dict)

    @classmethod
    def chosen(cls, engine: Engine, pipeline: str | None) -> Pipelines:
        known = known_pipelines(engine)
        if pipeline is not None:
            name = validate_pipeline(pipeline)
            if name not in known:
                names = ", ".join(known) or "none yet"
                raise InvalidInput(f"unknown pipeline {shown(name)} (this database has: {names})")
            known = {name: known[name]}
        return cls({name: load_timezone(zone or "UTC") for name, zone in known.items()})


def group_key(by: str, line: SpendLine, tz: ZoneInfo) -> tuple[str, ...]:
    """The group a line belongs to: (label,), or (pipeline, episode id) by episode."""
    if by in ("week", "month"):
        return (period_label(by, line.created_at, tz),)  # type: ignore[arg-type]
    if by == "episode":
        return (line.pipeline, line.episode_id)
    if by == "profile":
        return (line.profile,)
    return (line.pipeline,)


def group_lines(
    by: str, lines: Iterable[SpendLine], zone_of: Callable[[str], ZoneInfo]
) -> dict[tuple[tuple[str, ...], str], Figures]:
    """(group key, currency) -> figures of `lines`, every line in exactly one row."""
    groups: dict[tuple[tuple[str, ...], str], Figures] = {}
    for line in lines:
        key = (group_key(by, line, zone_of(line.pipeline)), line.currency)
        groups.setdefault(key, Figures()).add(line)
    return groups


def totals_of(groups: dict[tuple[tuple[str, ...], str], Figures]) -> dict[str, Figures]:
    """currency -> the sum of its rows."""
    totals: dict[str, Figures] = {}
    for (_, currency), figures in groups.items():
        total = totals.setdefault(currency, Figures())
        total.calls += figures.calls
        total.spent_micros += figures.spent_micros
        total.in_flight_calls += figures.in_flight_calls
        total.in_flight_micros += figures.in_flight_micros
    return totals


def window_lines(
    engine: Engine, chosen: Pipelines, since: date | None, until: date | None
) -> list[SpendLine]:
    """Every pipeline's paid calls of the window, each bounded in its own timezone."""
    lines: list[SpendLine] = []
    for name, tz in chosen.zones.items():
        start = _bound(since, tz)
        end = _bound(until + timedelta(days=1) if until not in (None, date.max) else None, tz)
        lines += spend_lines(engine, name, start, end)
    return lines


def spend_report(
    engine: Engine,
    *,
    by: str = "week",
    pipeline: str | None = None,
    since: date | None = None,
    until: date | None = None,
) -> dict[str, Any]:
    """The report: ``{by, pipelines: {name: timezone}, since, until, groups: [...],
    totals: [...]}``; a group row is ``{group, currency, calls, spent, spent_micros,
    in_flight_calls, in_flight, in_flight_micros}`` (and ``pipeline`` by episode), amounts
    as exact decimal strings and integer micro-units; `totals` one row per currency.
    Raises `InvalidInput` for an unknown grouping or pipeline, or since after until."""
    check_grouping(by)
    check_window(since, until)
    chosen = Pipelines.chosen(engine, pipeline)
    lines = window_lines(engine, chosen, since, until)
    groups = group_lines(by, lines, chosen.zones.__getitem__)
    rows = []
    for (key, currency), figures in sorted(groups.items()):
        row = {"group": key[-1], **figures.to_dict(currency)}
        if by == "episode":
            row["pipeline"] = key[0]
        rows.append(row)
    totals = totals_of(groups)
    return {
        "by": by,
        "pipelines": {name: str(tz) for name, tz in chosen.zones.items()},
        "since": None if since is None else since.isoformat(),
        "until": None if until is None else until.isoformat(),
        "until_inclusive": True,
        "groups": rows,
        "totals": [totals[c].to_dict(c) for c in sorted(totals)],
    }


def week_spend(engine: Engine, pipeline: str, week_id: str) -> dict[str, Any]:
    """The pipeline's spend in ISO week `week_id` of its timezone, by profile."""
    monday = WeekId.parse(week_id).monday()
    return spend_report(
        engine, by="profile", pipeline=pipeline, since=monday, until=monday + timedelta(days=6)
    )
