"""Money in integer minor units; decimals only at the boundary (parsing and printing)."""

from __future__ import annotations

import re
from decimal import Decimal

from core.errors import InvalidInput
from core.ids import shown

MINOR_DIGITS = 2  # cents
# What one image may cost, in minor units (10 million USD): a profile's price, a provider's
# reported cost and a legacy record's cost beyond it are not amounts we store.
MAX_IMAGE_COST_MINOR = 10**9
_SCALE = 100  # minor units per unit
# ASCII digits only (Decimal would take '١٢' or '1e999999999'), at most 9 before the point
_AMOUNT = re.compile(r"(0|[1-9][0-9]{0,8})(?:\.([0-9]{1,2}))?")


def parse_amount(text: str) -> int:
    """'12.50' -> 1250 (minor units). Plain ASCII decimals only, at most two decimals,
    0 to 999,999,999.99; anything else (exponents, NaN, signs, non-ASCII digits) is
    `InvalidInput`."""
    match = _AMOUNT.fullmatch(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise InvalidInput(
            f"invalid amount {shown(text)}: expected a plain amount such as 12.50 "
            f"(0 to 999999999.99, at most {MINOR_DIGITS} decimals)"
        )
    whole, cents = str(match[1]), str(match[2] or "")
    return int(whole) * _SCALE + int(cents.ljust(MINOR_DIGITS, "0"))


def format_minor(amount: int, currency: str = "USD") -> str:
    return f"{Decimal(amount).scaleb(-MINOR_DIGITS):.{MINOR_DIGITS}f} {currency}"
