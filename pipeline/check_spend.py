"""`check`'s money audits: every cost entry follows from its basis, and `spend` adds up.

A cost entry records its amount beside the basis, the measured quantity and the unit price
it was charged from (`core.pricing`): the amount is recomputed from those three
(`charge_of`, the engine's own rule, stated once) and an entry whose amount does not follow
is a finding. The spend report's totals (`pipeline.spend`) are held, for every grouping,
against the ledger's own SQL aggregate of the pipeline's cost entries, read at the same
moment: each currency's paid calls and exact total must be equal.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from core.money import amount_text, format_money
from core.pricing import charge_of
from pipeline.spend import GROUPINGS, Pipelines, group_lines, totals_of
from storage.audit import CostRecord
from storage.spend import audited_spend, known_pipelines
from storage.tx import Database


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


def verify_spend(engine: Database, pipeline: str) -> SpendCheck:
    """The report's totals of the pipeline by each grouping, against the ledger's sums."""
    result = SpendCheck(pipeline)
    if pipeline not in known_pipelines(engine):
        return result
    zones = Pipelines.chosen(engine, pipeline).zones
    lines, result.ledger = audited_spend(engine, pipeline)
    for by in GROUPINGS:
        totals = totals_of(group_lines(by, lines, zones.__getitem__))
        reported = {c: (t.calls, t.spent_micros) for c, t in totals.items() if t.calls}
        for currency in sorted(set(reported) | set(result.ledger)):
            got = reported.get(currency, (0, 0))
            want = result.ledger.get(currency, (0, 0))
            if got != want:
                result.problems.append(
                    f"spend --by {by} totals {got[0]} paid calls, "
                    f"{format_money(got[1], currency)}, but the ledger holds {want[0]}, "
                    f"{format_money(want[1], currency)}"
                )
    return result
