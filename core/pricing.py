"""What a paid call costs: a profile's price, its basis, and the charge of a delivered image.

A price is a unit price in micro-units (`episodic.core.money`) and the basis it is charged on:

=====================  ===================================  ====================================
basis                  quantity measured (recorded)         charge
=====================  ===================================  ====================================
``per_image``          images: 1                            unit
``per_megapixel``      pixels of the stored image (w x h)   unit x pixels / 10^6
``per_whole_megapixel`` pixels of the stored image (w x h)  unit x ceil(pixels / 10^6) (fal's
                                                            rule: every started megapixel)
``per_second``         microseconds of compute the          unit x microseconds / 10^6
                       provider reports for the job
``reported``           the provider's own figure, in        that figure (our http protocol and
                       micro-units                          the fake report one)
=====================  ===================================  ====================================

Every charge is rounded *up* to a whole micro-unit (a provider never bills less than its
rate), so it is an integer and `charge_of` recomputes it exactly from what the ledger
records beside it: basis, quantity and unit price (`episodic.pipeline.check`).

Before paying, the engine knows no quantity: a price's `estimate_quantity` is the profile's
stated upper bound (megapixels an image is at most; seconds a job runs at most), and
`Price.estimate_micros` what an item is reserved at (the caps and the period budgets count
it until the item settles to its real charge).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Basis = Literal["per_image", "per_megapixel", "per_whole_megapixel", "per_second"]
RecordedBasis = Literal[
    "per_image", "per_megapixel", "per_whole_megapixel", "per_second", "reported"
]
BASES: tuple[Basis, ...] = ("per_image", "per_megapixel", "per_whole_megapixel", "per_second")
RECORDED_BASES: frozenset[str] = frozenset(BASES) | {"reported"}
MILLION = 1_000_000
# What one measured quantity may be: 10^12 pixels (a million megapixels), 10^12 microseconds
# (11.5 days of compute), 1 image; a provider's reply beyond it is not believed.
MAX_QUANTITY = 10**12


def _ceil_div(numerator: int, denominator: int) -> int:
    return -(-numerator // denominator)


def charge_of(basis: str, unit_micros: int, quantity: int) -> int:
    """The charge in micro-units of `quantity` (see the module's table) at `unit_micros`.

    Raises ValueError for a basis that is not recorded here or a negative figure."""
    if unit_micros < 0 or quantity < 0:
        raise ValueError("a price and a quantity are never negative")
    if basis == "per_image" or basis == "reported":
        return unit_micros * quantity
    if basis in ("per_megapixel", "per_second"):
        return _ceil_div(unit_micros * quantity, MILLION)
    if basis == "per_whole_megapixel":
        return unit_micros * _ceil_div(quantity, MILLION)
    raise ValueError(f"unknown cost basis {basis!r}")


@dataclass(frozen=True, slots=True)
class Reservation:
    """What a paid call is reserved at from its intent until it settles (micro-units of
    `currency`): its price's estimate (`Price.estimate_micros`)."""

    micros: int
    currency: str | None

    @classmethod
    def none(cls) -> Reservation:
        return cls(0, None)


@dataclass(frozen=True, slots=True)
class Charge:
    """One paid call's cost as the ledger records it: the amount (micro-units of
    `currency`), the basis, the measured quantity and the unit price it follows from."""

    amount_micros: int
    currency: str
    basis: RecordedBasis
    quantity: int
    unit_micros: int

    @classmethod
    def reported(cls, amount_micros: int, currency: str) -> Charge:
        """The provider's own figure (quantity: the amount, at a unit of one micro-unit)."""
        return cls(amount_micros, currency, "reported", amount_micros, 1)


@dataclass(frozen=True, slots=True)
class Price:
    """A profile's price: `unit_micros` per unit of `basis`, in `currency`;
    `estimate_quantity` the most one image takes of the basis's quantity (1 image, pixels,
    microseconds), which estimates and reservations use before the real quantity is
    known."""

    basis: Basis
    unit_micros: int
    currency: str
    estimate_quantity: int

    @property
    def estimate_micros(self) -> int:
        """What an item is estimated and reserved at before it is paid."""
        return charge_of(self.basis, self.unit_micros, self.estimate_quantity)

    @property
    def reservation(self) -> Reservation:
        return Reservation(self.estimate_micros, self.currency)

    def charge(self, quantity: int) -> Charge:
        """The charge of a call whose measured quantity is `quantity`."""
        if not 0 <= quantity <= MAX_QUANTITY:
            raise ValueError(f"measured quantity {quantity} is out of range")
        return Charge(
            charge_of(self.basis, self.unit_micros, quantity),
            self.currency,
            self.basis,
            quantity,
            self.unit_micros,
        )

    def estimated_charge(self) -> Charge:
        """The charge at the stated upper bound (a billed failure without a measure)."""
        return self.charge(self.estimate_quantity)

    def settle(
        self,
        *,
        reported_micros: int | None = None,
        compute_us: int | None = None,
        pixels: int | None = None,
    ) -> Charge:
        """A finished call's charge: the provider's own figure when its reply has one;
        else the price on what was delivered (the stored image's `pixels`, the
        `compute_us` the provider reported); what was not measured (a failed job has no
        image; a reply without its compute time) is charged at the stated upper bound."""
        if reported_micros is not None:
            return Charge.reported(reported_micros, self.currency)
        if self.basis == "per_image":
            return self.charge(1)
        measured = compute_us if self.basis == "per_second" else pixels
        return self.estimated_charge() if measured is None else self.charge(measured)
