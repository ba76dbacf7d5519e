"""Money in integer micro-units (millionths of a currency unit); decimals only at the
boundary (parsing and printing). Never float.

Six decimals hold every price the providers publish (Replicate's $0.000725 per second of
GPU, fal's $0.025 per megapixel, $0.003 per image) exactly, and sums of them stay exact.
A cent is 10,000 micro-units: amounts recorded in whole minor units before (profiles'
``cost_per_image_minor``, legacy layouts, ledgers before migration 0016) convert exactly
(`micros_from_minor`).
"""

from __future__ import annotations

import re
from decimal import Decimal

from episodic.core.errors import InvalidInput
from episodic.core.ids import shown

MICRO_DIGITS = 6  # the decimals an amount or a price may have
MICROS = 10**MICRO_DIGITS  # micro-units per unit of a currency
MICROS_PER_MINOR = 10_000  # a cent: the minor unit of the 2-decimal currencies we record
# What one image may cost (10 million units): a profile's price, a provider's reported cost
# and a legacy record's cost beyond it are not amounts we store.
MAX_IMAGE_COST_MICROS = 10**7 * MICROS
# ASCII digits only (Decimal would take '١٢' or '1e999999999'), at most 9 before the point
AMOUNT_PATTERN = r"(0|[1-9][0-9]{0,8})(?:\.([0-9]{1,6}))?"
_AMOUNT = re.compile(AMOUNT_PATTERN)
_SEPARATORS = re.compile("[\x1c-\x1f]")


def parse_money(text: str, what: str = "amount") -> int:
    """'12.50' -> 12_500_000, '0.003' -> 3_000 (micro-units). Plain ASCII decimals only,
    at most six decimals, 0 to 999,999,999.999999; anything else (exponents, NaN, signs,
    non-ASCII digits, a seventh decimal) is `InvalidInput` naming `what`."""
    # str.strip() also drops the separators U+001C-U+001F, which no flow parameter's
    # pattern takes as space: refused here too, so the CLI and the flow take the same text
    plain = isinstance(text, str) and not _SEPARATORS.search(text)
    match = _AMOUNT.fullmatch(text.strip()) if plain else None
    if match is None:
        raise InvalidInput(
            f"invalid {what} {shown(text)}: expected a plain decimal such as 12.50 or 0.003 "
            f"(0 to 999999999.999999, at most {MICRO_DIGITS} decimals)"
        )
    whole, fraction = str(match[1]), str(match[2] or "")
    micros: int = int(whole) * MICROS + int(fraction.ljust(MICRO_DIGITS, "0"))
    return micros


def micros_from_minor(minor: int) -> int:
    """Whole minor units (cents) as micro-units, exactly."""
    return minor * MICROS_PER_MINOR


def decimal_of(micros: int) -> Decimal:
    """The amount as an exact Decimal, with at least two decimals and no trailing zeros
    beyond them: 12_500_000 -> Decimal('12.50'), 3_000 -> Decimal('0.003')."""
    value = Decimal(micros).scaleb(-MICRO_DIGITS)
    digits = MICRO_DIGITS
    while digits > 2 and micros % 10 ** (MICRO_DIGITS - digits + 1) == 0:
        digits -= 1
    return value.quantize(Decimal(1).scaleb(-digits))


def amount_text(micros: int) -> str:
    """'12.50', '0.003', '-0.000725': the exact decimal, for JSON, CSV and artifacts."""
    return f"{decimal_of(micros):f}"


def format_money(micros: int, currency: str = "USD") -> str:
    """'12.50 USD', '0.003 USD': exact, at least two decimals, at most six."""
    return f"{amount_text(micros)} {currency}"


def format_totals(totals: dict[str, int]) -> str:
    """Amounts in several currencies, never summed across them: '0.12 USD + 0.50 EUR'
    (sorted by currency; '0.00 USD' for none)."""
    if not totals:
        return format_money(0)
    return " + ".join(format_money(totals[c], c) for c in sorted(totals))


def add_to(totals: dict[str, int], currency: str, micros: int) -> None:
    """Count `micros` of `currency` into `totals` (per currency, never across)."""
    totals[currency] = totals.get(currency, 0) + micros
