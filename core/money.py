"""Money in integer minor units; decimals only at the boundary (parsing and printing)."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from core.errors import InvalidInput

MINOR_DIGITS = 2  # cents


def parse_amount(text: str) -> int:
    """'12.50' -> 1250. Refuses negatives, more than two decimals, NaN and junk."""
    try:
        value = Decimal(text.strip())
    except (InvalidOperation, AttributeError):
        raise InvalidInput(f"invalid amount {text!r}: expected e.g. 12.50") from None
    if not value.is_finite() or value < 0:
        raise InvalidInput(f"invalid amount {text!r}: must be a non-negative number")
    minor = value.scaleb(MINOR_DIGITS)
    if minor != minor.to_integral_value():
        raise InvalidInput(f"invalid amount {text!r}: at most {MINOR_DIGITS} decimals")
    return int(minor)


def format_minor(amount: int, currency: str = "USD") -> str:
    return f"{Decimal(amount).scaleb(-MINOR_DIGITS):.{MINOR_DIGITS}f} {currency}"
