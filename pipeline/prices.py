"""What a paid call's charge says about its price, once the provider has billed it.

- **A failed or cancelled job** costs what its price says (`failure_charge`): the provider's
  own figure when its reply has one; nothing when the adapter knows the provider did not
  bill it (fal's failed requests, Replicate's aborted predictions) or, without a figure, when
  the profile's price says such a job is not billed (``failed: free``,
  `Profile.bills_failures`: Replicate's models billed by output, fal); else the price on what
  the job measured (per second: the time it ran, as Replicate bills hardware time).
- **A charge above the price's bound** (`above_price`): the bound is the price's estimate,
  what every cap, budget and reservation counted the call at before its bill (``at_most``,
  the size the inputs ask for, the price of one image). A charge above it means each later
  call of that price would be reserved below what the provider bills: the run is paused at
  once (`episodic.core.runs.PRICE_STOPPED`), with the charge named, until the price is corrected. A
  free price (estimate 0) states no bound: its calls count at its dearest charge
  (`episodic.storage.budgets`).
"""

from __future__ import annotations

from episodic.core.money import format_money
from episodic.core.pricing import Charge, Price
from episodic.core.runs import PRICE_STOPPED
from episodic.providers.base import RemoteJobFailed
from episodic.providers.profiles import Profile

__all__ = ["PRICE_STOPPED", "above_price", "failure_charge"]


def failure_charge(price: Price, profile: Profile, exc: RemoteJobFailed) -> Charge | None:
    """The charge of the job `exc` ended failed or cancelled, None for no cost (module)."""
    if not exc.billed:
        return None
    if exc.reported_micros is not None:
        return price.settle(reported_micros=exc.reported_micros)
    if not profile.bills_failures:
        return None
    return price.settle(compute_us=exc.compute_us)


def above_price(
    price: Price, profile: Profile, remote_ref: str, charge: Charge | None
) -> str | None:
    """Why a run stops buying when `charge` passes its price's bound, or None (module)."""
    bound = price.estimate_micros
    if charge is None or bound == 0 or charge.amount_micros <= bound:
        return None
    money = charge.currency
    return (
        f"job {remote_ref[:80]} was charged {format_money(charge.amount_micros, money)}, "
        f"above the {format_money(bound, money)} that provider profile {profile.id!r} "
        f"states a call costs at most ({profile.estimate_basis_text}); correct its price in "
        "the providers file"
    )
