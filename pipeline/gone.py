"""An accepted job whose output the provider deleted before it was collected.

Replicate removes an API prediction's outputs after an hour, fal keeps a request's result an
hour (`providers.replicate`, `providers.fal` cite the pages). When the provider proves the
output gone (`episodic.providers.base.OutputGone`: its reply says so, or the delivery answers 404
again after a fresh poll), the collect ends at once and `record_gone` writes, in one
transaction (`ProviderOutputs.close_gone`): the submission closed failed with the charge the
provider made for it (the job was paid), and its output recorded lost (`lost_outputs`), which
is what ``episodic media restore E --buy-again`` buys again. The item is released failed with
the line `record_gone` returns: what it cost and that command; never "at no cost".
"""

from __future__ import annotations

from sqlalchemy import Engine

from episodic.core.money import format_money
from episodic.core.pricing import Price
from episodic.pipeline.gate import GatePass
from episodic.storage.provider_outputs import ProviderOutputs

LOST_TEXT = "output lost at the provider"
"""How the item's message of an output gone at the provider begins (`record_gone`): a resume
cannot collect it, and only `media restore --buy-again` buys it again."""


class LostAtProvider(Exception):
    """The accepted job's output is gone at the provider (recorded lost, with its charge)."""


def record_gone(
    engine: Engine,
    gate: GatePass,
    price: Price,
    submission_pk: int,
    item_pk: int,
    why: str,
    compute_us: int | None,
) -> str:
    """Close the submission failed with its charge, record its output lost; the item's line."""
    charge = price.settle(compute_us=compute_us)
    paid = format_money(charge.amount_micros, charge.currency)
    text = (
        f"{LOST_TEXT}: {why}; the job was paid ({paid}, recorded) and cannot "
        f"be collected any more; buy it again with `episodic media restore {gate.episode_id} "
        f"--pipeline {gate.pipeline} --buy-again`"
    )[:2000]
    ProviderOutputs(engine).close_gone(
        submission_pk, item_pk, text, episode_pk=gate.episode_pk, charge=charge
    )
    return text
