"""`check`'s money audits: every cost entry follows from its basis, none passes what its
call was reserved at, and `spend` adds up.

A cost entry records its amount beside the basis, the measured quantity and the unit price
it was charged from (`episodic.core.pricing`): the amount is recomputed from those three
(`charge_of`, the engine's own rule, stated once) and an entry whose amount does not follow
is a finding. The spend report's totals (`episodic.pipeline.spend`) are held, for every grouping,
against the ledger's own SQL aggregate of the pipeline's cost entries, read at the same
moment: each currency's paid calls and exact total must be equal.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Engine

from episodic.core.money import amount_text, format_money
from episodic.core.periods import PERIOD_KINDS, PeriodKind, period_bounds, period_label
from episodic.core.pricing import charge_of
from episodic.pipeline.spend import GROUPINGS, Pipelines, group_lines, totals_of
from episodic.storage.audit import CostRecord, SubmissionRecord
from episodic.storage.spend import SpendLine, audited_spend, known_pipelines


def check_costs(add: Callable[[str, str], None], costs: Sequence[CostRecord]) -> None:
    """A finding for each cost entry whose amount does not follow from its basis,
    quantity and unit price."""
    for cost in costs:
        try:
            expected = charge_of(cost.basis, cost.unit_price_micros, cost.quantity)
        except ValueError as exc:
            add("cost", f"cost entry {cost.id} cannot be recomputed: {exc}")
            continue
        if expected != cost.amount_micros:
            add(
                "cost",
                f"cost entry {cost.id} records {format_money(cost.amount_micros, cost.currency)}"
                f" but its basis makes {format_money(expected, cost.currency)} "
                f"({cost.basis}: quantity {cost.quantity} at "
                f"{format_money(cost.unit_price_micros, cost.currency)})",
            )


def check_reservations(
    add: Callable[[str, str], None], subs: Sequence[SubmissionRecord], costs: Sequence[CostRecord]
) -> None:
    """A finding for each charge above what its call was reserved at (the price's bound, or
    a charge seen before it): the caps and budgets counted that call below what the provider
    billed, so its price's bound is wrong. A call reserved at 0 (a free price) states none."""
    reserved = {s.id: (s.reserved_micros, s.client_reference) for s in subs}
    for cost in costs:
        bound, reference = reserved.get(cost.submission_pk, (0, ""))
        if 0 < bound < cost.amount_micros and _follows(cost):  # else `check_costs` says it
            add(
                "cost",
                f"submission {reference} was charged "
                f"{format_money(cost.amount_micros, cost.currency)}, above the "
                f"{format_money(bound, cost.currency)} its caps and budgets counted it at: "
                "correct its profile's price (at_most, or the price itself)",
            )


def _follows(cost: CostRecord) -> bool:
    try:
        return charge_of(cost.basis, cost.unit_price_micros, cost.quantity) == cost.amount_micros
    except ValueError:
        return False


@dataclass
class SpendCheck:
    """The spend totals audit of one pipeline: the ledger's sums, and what disagrees."""

    pipeline: str
    ledger: dict[str, tuple[int, int]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline,
            "verified": not self.problems,
            "groupings": list(GROUPINGS),
            "ledger": [
                {
                    "currency": currency,
                    "calls": calls,
                    "spent_micros": micros,
                    "spent": amount_text(micros),
                }
                for currency, (calls, micros) in sorted(self.ledger.items())
            ],
            "problems": list(self.problems),
        }


def verify_spend(engine: Engine, pipeline: str) -> SpendCheck:
    """The report's totals of the pipeline by each grouping, against the ledger's sums;
    and each week's and month's row against the ledger's sum of that period's bounds
    (`episodic.core.periods.period_bounds`, the budgets' window), so labels and bounds agree."""
    result = SpendCheck(pipeline)
    if pipeline not in known_pipelines(engine):
        return result
    zones = Pipelines.chosen(engine, pipeline).zones
    tz = zones[pipeline]

    def periods(lines: list[SpendLine]) -> list[tuple[str, datetime, datetime]]:
        found: dict[str, tuple[PeriodKind, datetime]] = {}  # '2026-W49' or '2026-12'
        for line in lines:
            for kind in PERIOD_KINDS:
                found.setdefault(period_label(kind, line.created_at, tz), (kind, line.created_at))
        return [
            (label, *period_bounds(kind, moment, tz)) for label, (kind, moment) in found.items()
        ]

    lines, result.ledger, by_period = audited_spend(engine, pipeline, periods)
    for by in GROUPINGS:
        groups = group_lines(by, lines, zones.__getitem__)
        totals = totals_of(groups)
        reported = {c: (t.calls, t.spent_micros) for c, t in totals.items() if t.calls}
        _compare(result, f"spend --group-by {by} totals", reported, result.ledger)
        if by in PERIOD_KINDS:
            ledgers = {label for label in by_period if ("-W" in label) == (by == "week")}
            for label in sorted({key[-1] for key, _ in groups} | ledgers):
                row = {
                    currency: (f.calls, f.spent_micros)
                    for (key, currency), f in groups.items()
                    if key[-1] == label and f.calls
                }
                _compare(
                    result, f"spend --group-by {by} row {label}", row, by_period.get(label, {})
                )
    return result


def _compare(
    result: SpendCheck,
    what: str,
    reported: dict[str, tuple[int, int]],
    ledger: dict[str, tuple[int, int]],
) -> None:
    for currency in sorted(set(reported) | set(ledger)):
        got, want = reported.get(currency, (0, 0)), ledger.get(currency, (0, 0))
        if got != want:
            result.problems.append(
                f"{what} {got[0]} paid calls, {format_money(got[1], currency)}, but the "
                f"ledger holds {want[0]}, {format_money(want[1], currency)}"
            )
