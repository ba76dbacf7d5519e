"""Every cap and every period budget held against money spent, inside the claim.

Before a *new paid call* (a claim's ``submit``, a re-buy or a forced resubmit:
`LeaseStore.new_attempt`) the claim's transaction reads what the run and its pipeline have
spent and refuses the call (`RefusalReason.BUDGET`, with a reason naming the limit) when it
would pass a limit. Settling an open submission (collect, reconcile) is never refused: it
costs nothing new.

- **The run's limits** (`core.planning.RunLimits`: --max-images, --max-cost, else the per-run
  cap EPISODIC_MAX_RUN_COST), across all the run's resumes and processes: its calls are its
  submissions (as `RunCounts.paid_submissions`); its spend is the sum of its cost entries
  plus, for each of its open submissions (intent, accepted, unknown) without one, the larger
  of its reservation and the *unit*; the next call costs the unit.
- **The unit** is what a new paid call is reserved at, and what every call of the same price
  in flight counts at: the larger of the price's estimate, the largest charge the run has
  recorded, and the largest charge the provider has billed for the same price (the same
  provider profile, in its currency) on calls made in the last 31 days (`PRICE_MEMORY`,
  longer than any budget period) by any run, pipeline, process or machine. So a reply that
  bills above the estimate counts at once, for the next call of every run and every call in
  flight, and a new run starts from what the provider billed the runs before it.
- **A price not billed yet** is probed: under a money limit (a cap or a period budget), while
  the price has no recorded charge and a call of it is open without one (any run's, made
  within the profile's ``max_job_s``: a job older than that is not waited for, as the
  provider slots count it), the next call waits (``throttled``: asked again shortly) for
  that call's bill. Concurrent runs of a new price thus send one call, not a batch, before they know
  what it bills. A price whose estimate is 0 (a profile declared free) is the same case: its
  calls then count at the dearest charge of the budget's period, of any run.
- **A charge above the price's bound**: once the run has recorded a charge above the price's
  estimate (``at_most``, the known size, the price of one image; a free price states none),
  every new call of the run is refused (``charge above the price:``, `PRICE_MARK`) in every
  process: each then collects what it has in flight and the run is paused
  (`episodic.core.runs.PRICE_STOPPED`) until the price is corrected.
- **The pipeline's period budgets** (``pipeline_budgets``: per ISO week, per calendar month,
  in the pipeline's timezone, `episodic.core.periods`): a paid call is dated by its submission's
  ``created_at``; the period's spend is the sum of the pipeline's cost entries in the
  budget's currency whose submissions fall in the period, plus the reservations of its open
  submissions without one (every run, process, flow run and machine together; one of the
  claim's own price counted at least at the unit); the next call costs the unit. A profile
  whose currency is not the budget's is refused (never summed).

Concurrency: the claim takes the advisory locks ``spend:{run}`` and ``budget:{pipeline}``
together with its provider lock, first and in one global order (`episodic.storage.tx.write`,
`episodic.storage.locks`), so two claimers anywhere never both pass on the same remaining money;
SQLite's write lock serializes every writer already. The reads are hand-written and run on
the bare driver (`episodic.storage.dbapi`), as the claim's own (bench/ledger.py counts them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import Connection, Engine, Table, delete

from episodic.core.errors import InvalidInput
from episodic.core.money import format_money
from episodic.core.periods import PeriodKind, period_bounds, period_label
from episodic.core.planning import RunLimits
from episodic.core.pricing import Reservation
from episodic.core.records import RefusalReason
from episodic.core.runs import Refusal
from episodic.storage import dbapi, predicates, tx
from episodic.storage.base import utcnow
from episodic.storage.dbapi import DriverSQL
from episodic.storage.models import PipelineBudgetRow
from episodic.storage.tx import retry_outages

_budgets: Table = PipelineBudgetRow.__table__  # type: ignore[assignment]

_OPEN = predicates.OPEN_SQL.replace("state", "s.state")
_NO_COST = "NOT EXISTS (SELECT 1 FROM cost_entries k WHERE k.submission_pk = s.id)"

# The run's figures: its calls; its cost entries (count, sum); the unit (the larger of
# `b_estimate` and its largest charge, computed first by the CTE); and its open submissions
# without a cost (count, and the sum of their reservations, each counted at least the unit).
# `b_estimate` comes in already raised to the price's dearest recorded charge (`PRICE_SEEN`).
RUN_SPEND = DriverSQL(
    "WITH c AS (SELECT count(*) AS n, COALESCE(SUM(k.amount_micros), 0) AS spent, "
    "COALESCE(MAX(k.amount_micros), 0) AS top FROM cost_entries k JOIN submissions s "
    "ON s.id = k.submission_pk WHERE s.run_id = :b_run), "
    "u AS (SELECT CASE WHEN c.top > :b_estimate THEN c.top ELSE :b_estimate END AS unit "
    "FROM c) "
    "SELECT (SELECT count(*) FROM submissions WHERE run_id = :b_run), c.n, c.spent, u.unit, "
    "(SELECT count(*) FROM submissions s WHERE s.run_id = :b_run AND "
    f"{_OPEN} AND {_NO_COST}), "
    "(SELECT COALESCE(SUM(CASE WHEN s.reserved_micros > u.unit THEN s.reserved_micros "
    f"ELSE u.unit END), 0) FROM submissions s WHERE s.run_id = :b_run AND {_OPEN} AND "
    f"{_NO_COST}), c.top FROM c, u"
)

# What the provider has billed for this price: the charges in its currency of the profile's
# calls made since `b_since` (every run, pipeline, process and machine): their count and the
# dearest; and the profile's calls in flight now without a charge yet whose item a live claim
# holds (someone is following them: their bill comes soon).
PRICE_SEEN = DriverSQL(
    "SELECT count(*), COALESCE(MAX(k.amount_micros), 0) FROM cost_entries k "
    "JOIN submissions s ON s.id = k.submission_pk WHERE s.provider_profile = :b_profile "
    "AND k.currency = :b_currency AND s.created_at >= :b_since"
)
PRICE_PROBES = DriverSQL(
    "SELECT count(*) FROM submissions s "
    f"WHERE s.provider_profile = :b_profile AND {_OPEN} AND {_NO_COST} AND "
    "s.created_at >= :b_since AND s.created_at > :b_recent"
)
# How far back a price's charges are evidence of what it bills: longer than any budget
# period (a calendar month), so every period's charges are among them.
PRICE_MEMORY = timedelta(days=31)

# The pipeline's budgets and its timezone (the pipeline row exists once it has a budget).
BUDGETS = DriverSQL(
    "SELECT b.period, b.amount_micros, b.currency, p.timezone FROM pipeline_budgets b "
    "JOIN pipelines p ON p.name = b.pipeline WHERE b.pipeline = :b_pipeline ORDER BY b.period"
)

# The same, as one JSON array of [period, amount, currency, timezone] (PostgreSQL: a part of
# the claim's one read, `Check.parts`).
BUDGETS_JSON = (
    "SELECT json_agg(json_build_array(b.period, b.amount_micros, b.currency, p.timezone) "
    "ORDER BY b.period) FROM pipeline_budgets b JOIN pipelines p ON p.name = b.pipeline "
    "WHERE b.pipeline = :b_pipeline"
)

# One period's spend of a pipeline in one currency: cost entries of submissions dated in
# [start, end), and the reservations of its open submissions without a cost.
PERIOD_SPEND = DriverSQL(
    "SELECT (SELECT COALESCE(SUM(k.amount_micros), 0) FROM cost_entries k "
    "JOIN submissions s ON s.id = k.submission_pk JOIN episodes e ON e.id = k.episode_pk "
    "WHERE e.pipeline = :b_pipeline AND k.currency = :b_currency AND "
    "s.created_at >= :b_start AND s.created_at < :b_end), "
    # (a call of the claim's own price counts at least at its unit: what it may be billed)
    "(SELECT COALESCE(SUM(CASE WHEN s.provider_profile = :b_profile AND "
    "s.reserved_micros < :b_unit THEN :b_unit ELSE s.reserved_micros END), 0) "
    "FROM submissions s "
    "JOIN items i ON i.id = s.item_pk JOIN episodes e ON e.id = i.episode_pk "
    "WHERE e.pipeline = :b_pipeline AND s.currency = :b_currency AND "
    f"s.created_at >= :b_start AND s.created_at < :b_end AND {_OPEN} AND {_NO_COST}), "
    # its open calls reserved at nothing (a free price's probes, of any run): while one is
    # out, no run of the pipeline sends another whose price is 0 (see `Check.refusal`)
    "(SELECT count(*) FROM submissions s "
    "JOIN items i ON i.id = s.item_pk JOIN episodes e ON e.id = i.episode_pk "
    "WHERE e.pipeline = :b_pipeline AND s.reserved_micros = 0 AND "
    f"s.created_at >= :b_start AND s.created_at < :b_end AND {_OPEN} AND {_NO_COST}), "
    # its dearest charge: what a free price's call is counted at once any run has one
    "(SELECT COALESCE(MAX(k.amount_micros), 0) FROM cost_entries k "
    "JOIN submissions s ON s.id = k.submission_pk JOIN episodes e ON e.id = k.episode_pk "
    "WHERE e.pipeline = :b_pipeline AND k.currency = :b_currency AND "
    "s.created_at >= :b_start AND s.created_at < :b_end)"
)


def lock_names(run_id: str, pipeline: str | None) -> list[str]:
    """The advisory locks a claim or a re-buy takes for the money checks (`storage.locks`)."""
    return [f"spend:{run_id}"] + ([f"budget:{pipeline}"] if pipeline is not None else [])


@dataclass(frozen=True, slots=True)
class Guard:
    """What one claim holds its new paid calls against: the run's limits and, with
    `pipeline`, that pipeline's period budgets; `reserve` is what one call is reserved at."""

    run_id: str
    pipeline: str | None
    limits: RunLimits
    reserve: Reservation
    profile: str | None = None  # the provider profile whose price `reserve` is
    # how long a call of a price never billed is waited for before the next goes (the
    # profile's `max_job_s`: a job older than that is not coming back soon, as the slots)
    probe_window_s: float = 60.0

    @property
    def locks(self) -> list[str]:
        return lock_names(self.run_id, self.pipeline)


@dataclass
class _Period:
    kind: str
    label: str
    budget: int
    currency: str
    spent: int
    in_flight: int
    unpriced_open: int = 0  # open calls of the period reserved at 0 (free prices' probes)
    top: int = 0  # the period's dearest charge


@dataclass
class Check:
    """The money checks of one transaction: read once at its first new paid call, then kept
    up to date in memory as the transaction commits intents (`took`)."""

    conn: Connection
    guard: Guard
    now: datetime
    _read: bool = False
    calls: int = 0
    charges: int = 0
    spent: int = 0
    unit: int = 0
    open_calls: int = 0
    in_flight: int = 0
    periods: list[_Period] = field(default_factory=list)
    price_charges: int = 0  # charges recorded for the profile's price (`PRICE_SEEN`)
    price_probes: int = 0  # its calls in flight without a charge, made within the window
    run_top: int = 0  # the run's own dearest charge

    def _priced(self) -> dict[str, Any] | None:
        """`PRICE_SEEN`'s parameters, or None when the guard names no priced profile."""
        guard = self.guard
        if guard.profile is None or guard.reserve.currency is None:
            return None
        since = self.now - PRICE_MEMORY
        return {"b_profile": guard.profile, "b_currency": guard.reserve.currency, "b_since": since}

    def _recent(self) -> datetime:
        return self.now - timedelta(seconds=self.guard.probe_window_s)

    def _load(self) -> None:
        guard = self.guard
        estimate = guard.reserve.micros
        seen = self._priced()
        if seen is not None:
            found = dbapi.fetch_one(self.conn, PRICE_SEEN, seen)
            assert found is not None
            self.price_charges, dearest = int(found[0]), int(found[1])
            estimate = max(estimate, dearest)  # what the provider has shown it bills
            if self.price_charges == 0:
                self.price_probes = int(
                    dbapi.scalar(self.conn, PRICE_PROBES, {**seen, "b_recent": self._recent()})
                )
        found = dbapi.fetch_one(
            self.conn, RUN_SPEND, {"b_run": guard.run_id, "b_estimate": estimate}
        )
        assert found is not None  # an aggregate answers one row
        budgets = (
            None
            if guard.pipeline is None
            else dbapi.fetch_all(self.conn, BUDGETS, {"b_pipeline": guard.pipeline})
        )
        self._apply(tuple(found), budgets)

    def parts(self) -> list[dbapi.Part]:
        """`_load`'s reads as parts of the claim's one read (PostgreSQL, `dbapi.fetch_parts`),
        for `given`: the price's charges and probes, the run's figures with the estimate raised
        to the price's dearest charge in SQL, and the pipeline's budgets as one JSON array. The
        periods' spend is read after (`_periods`: each needs the unit)."""
        guard = self.guard
        parts = []
        estimate = ":b_estimate"
        seen = self._priced()
        if seen is not None:
            parts.append(dbapi.Part(PRICE_SEEN.sqlite, seen, 2))
            parts.append(dbapi.Part(PRICE_PROBES.sqlite, {**seen, "b_recent": self._recent()}, 1))
            estimate = f"GREATEST(:b_estimate, ({PRICE_SEEN.sqlite.replace('count(*), ', '')}))"
        spend = {"b_run": guard.run_id, "b_estimate": guard.reserve.micros, **(seen or {})}
        parts.append(dbapi.Part(RUN_SPEND.sqlite.replace(":b_estimate", estimate), spend, 7))
        if guard.pipeline is not None:
            parts.append(dbapi.Part(BUDGETS_JSON, {"b_pipeline": guard.pipeline}, 1))
        return parts

    def given(self, rows: list[tuple[Any, ...]]) -> None:
        """The answers of `parts`, in their order."""
        answers = iter(rows)
        if self._priced() is not None:
            self.price_charges = int(next(answers)[0])
            probes = int(next(answers)[0])
            self.price_probes = probes if self.price_charges == 0 else 0
        found = next(answers)
        budgets = None
        if self.guard.pipeline is not None:
            budgets = [tuple(b) for b in next(answers)[0] or ()]
        self._apply(found, budgets)

    def _apply(self, found: tuple[Any, ...], budgets: Sequence[Sequence[Any]] | None) -> None:
        """The run's figures (`RUN_SPEND`'s row) and the pipeline's budgets (`BUDGETS`' rows,
        None without a pipeline), then each budget's period read."""
        guard = self.guard
        (
            self.calls,
            self.charges,
            self.spent,
            self.unit,
            self.open_calls,
            self.in_flight,
            self.run_top,
        ) = (int(v) for v in found)
        if budgets is not None:
            assert guard.pipeline is not None
            self.periods = _periods(
                self.conn, guard.pipeline, budgets, self.now, profile=guard.profile, unit=self.unit
            )
        if guard.reserve.micros == 0:  # a free price: count each call at the dearest charge
            # yet seen, in any run of the budget's period (another run's probe showed the bill)
            self.unit = max([self.unit] + [p.top for p in self.periods])
        self._read = True

    def refusal(self) -> Refusal | None:
        """Why the next new paid call may not be made now, or None (see the module)."""
        if not self._read:
            self._load()
        limits, currency = self.guard.limits, self.guard.reserve.currency
        money = limits.max_cost_micros is not None or bool(self.periods)
        if (
            money
            and self.unit == 0
            and (
                (self.charges == 0 and self.open_calls)
                or any(p.unpriced_open for p in self.periods)
            )
        ):  # a free price's probe is out (this run's, or any run's of the budget's pipeline)
            return Refusal(RefusalReason.THROTTLED)  # wait for its bill
        if money and self.price_charges == 0 and self.charges == 0 and self.price_probes:
            # a price the provider has never billed yet under a money limit: one call of it
            # is out (in any run), and its bill shows what every later call is counted at
            return Refusal(RefusalReason.THROTTLED)
        bound = self.guard.reserve.micros
        if 0 < bound < self.run_top:  # the provider billed this run above what its price says
            return _refused(
                f"{PRICE_MARK} the provider charged one call of this run "
                f"{format_money(self.run_top, currency or 'USD')}, above the "
                f"{format_money(bound, currency or 'USD')} that provider profile "
                f"{self.guard.profile!r} states a call costs at most; correct its price in "
                "the providers file"
            )
        if limits.max_images is not None and self.calls + 1 > limits.max_images:
            return _refused(
                f"--max-images {limits.max_images}: the run has made {self.calls} paid calls"
            )
        cur = currency or "USD"
        if limits.max_cost_micros is not None:
            cap = limits.max_cost_micros
            if self.spent + self.in_flight + self.unit > cap:
                return _refused(
                    f"{limits.cost_label} {format_money(cap, cur)}: the run has spent "
                    f"{format_money(self.spent, cur)}, {format_money(self.in_flight, cur)} in "
                    f"flight, and the next call costs up to {format_money(self.unit, cur)}"
                )
        for period in self.periods:
            if currency is not None and currency != period.currency:
                return _refused(
                    f"pipeline {self.guard.pipeline!r} has a {period.kind}ly budget in "
                    f"{period.currency}, and this profile is priced in {currency}: its "
                    "calls cannot be counted against it (never summed across currencies)"
                )
            if period.spent + period.in_flight + self.unit > period.budget:
                return _refused(
                    f"pipeline {self.guard.pipeline!r} {period.kind}ly budget "
                    f"{format_money(period.budget, period.currency)} ({period.label}): spent "
                    f"{format_money(period.spent, period.currency)}, "
                    f"{format_money(period.in_flight, period.currency)} in flight, and the "
                    f"next call costs up to {format_money(self.unit, period.currency)}"
                )
        return None

    def reservation(self) -> Reservation:
        """What the next new paid call is reserved at: the unit (the module), so every later
        check, of this run or of any other run against the same period budget, counts the
        call in flight at what a reply has shown the provider bills (a free profile billed
        0.40 in its replies reserves 0.40 from its second call on), not at the price's 0."""
        if not self._read:
            self._load()
        return Reservation(max(self.guard.reserve.micros, self.unit), self.guard.reserve.currency)

    def took(self) -> None:
        """A new paid call's intent was committed in this transaction (at `reservation`)."""
        counted = self.reservation().micros
        self.calls += 1
        self.open_calls += 1
        self.in_flight += counted
        self.price_probes += 1
        for period in self.periods:
            period.in_flight += counted
            period.unpriced_open += int(counted == 0)


PRICE_MARK = "charge above the price:"
"""How a refusal's detail starts when a charge of the run passed its price's bound (the run
is then paused as `episodic.core.runs.PRICE_STOPPED`, not as a budget reached)."""


def _refused(detail: str) -> Refusal:
    return Refusal(RefusalReason.BUDGET, None, detail)


def _periods(
    conn: Connection,
    pipeline: str,
    budgets: Sequence[Sequence[Any]],
    now: datetime,
    *,
    profile: str | None = None,
    unit: int = 0,
) -> list[_Period]:
    """Each of the pipeline's `budgets` (`BUDGETS`' rows) with its period's spend."""
    out = []
    for kind, amount, currency, timezone in budgets:
        spent, in_flight, unpriced, top = period_spend(
            conn, pipeline, kind, currency, timezone, now, profile=profile, unit=unit
        )
        label = period_label(kind, now, ZoneInfo(timezone))
        out.append(_Period(kind, label, int(amount), currency, spent, in_flight, unpriced, top))
    return out


def period_spend(
    conn: Connection,
    pipeline: str,
    kind: PeriodKind,
    currency: str,
    timezone: str,
    now: datetime,
    *,
    profile: str | None = None,
    unit: int = 0,
) -> tuple[int, int, int, int]:
    """(spent, in flight, open calls reserved at 0, the dearest charge) of `pipeline` in
    `currency` in the `kind` period containing `now` in `timezone`; an open call of
    `profile` counts in flight at least at `unit`."""
    start, end = period_bounds(kind, now, ZoneInfo(timezone))
    params: dict[str, Any] = {
        "b_pipeline": pipeline,
        "b_currency": currency,
        "b_start": start,
        "b_end": end,
        "b_profile": profile,
        "b_unit": unit,
    }
    found = dbapi.fetch_one(conn, PERIOD_SPEND, params)
    assert found is not None
    return int(found[0]), int(found[1]), int(found[2]), int(found[3])


@dataclass(frozen=True, slots=True)
class Budget:
    pipeline: str
    period: str
    amount_micros: int
    currency: str


_BUDGET_ROWS = DriverSQL(
    "SELECT pipeline, period, amount_micros, currency FROM pipeline_budgets "
    "ORDER BY pipeline, period"
)
_TIMEZONE = DriverSQL("SELECT timezone FROM pipelines WHERE name = :b_pipeline")


@retry_outages
class BudgetStore:
    """The pipelines' period budgets (``pipeline_budgets``; `episodic pipelines set-budget`)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def standing(self, pipeline: str) -> list[tuple[str, str, int, str, int, int]]:
        """The pipeline's budgets as they stand now: (period, label, budget, currency,
        spent, in flight) each."""
        with tx.read(self.engine) as conn:
            return [
                (p.kind, p.label, p.budget, p.currency, p.spent, p.in_flight)
                for p in _periods(
                    conn,
                    pipeline,
                    dbapi.fetch_all(conn, BUDGETS, {"b_pipeline": pipeline}),
                    utcnow(),
                )
            ]

    def list(self) -> list[Budget]:
        with tx.read(self.engine) as conn:
            rows = dbapi.fetch_all(conn, _BUDGET_ROWS, {})
        return [Budget(r[0], r[1], int(r[2]), r[3]) for r in rows]

    def set(
        self, pipeline: str, period: PeriodKind, amount_micros: int | None, currency: str
    ) -> tuple[int, int]:
        """Record (or with None, clear) the pipeline's `period` budget, under the lock the
        claims take (`budget:{pipeline}`), unless the current period has already spent more
        than `amount_micros`. Returns the period's (spent, in flight) in `currency`;
        raises `InvalidInput` (nothing written) for a budget below what is spent. The
        pipeline's row exists (`PipelineStore.ensure`)."""
        with tx.write(self.engine, lock=[f"budget:{pipeline}"]) as conn:
            found = dbapi.fetch_one(conn, _TIMEZONE, {"b_pipeline": pipeline})
            if found is None:
                raise LookupError(f"pipeline {pipeline!r} is not recorded")
            spent, in_flight, _, _ = period_spend(
                conn, pipeline, period, currency, found[0], utcnow()
            )
            if amount_micros is None:
                conn.execute(
                    delete(_budgets).where(
                        _budgets.c.pipeline == pipeline, _budgets.c.period == period
                    )
                )
                return spent, in_flight
            if amount_micros < spent:
                label = period_label(period, utcnow(), ZoneInfo(found[0]))
                raise InvalidInput(
                    f"budget {format_money(amount_micros, currency)} per {period} is below "
                    f"what pipeline {pipeline!r} has already spent this {period} ({label}): "
                    f"{format_money(spent, currency)}; nothing was changed"
                )
            values = {"amount_micros": amount_micros, "currency": currency, "updated_at": utcnow()}
            conn.execute(
                tx.insert_for(conn, _budgets)
                .values(pipeline=pipeline, period=period, **values)
                .on_conflict_do_update(index_elements=["pipeline", "period"], set_=values)
            )
        return spent, in_flight
