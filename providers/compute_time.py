"""The compute time a job reply reports, exactly: what a per_second price is charged on."""

from __future__ import annotations

from decimal import ROUND_CEILING, Decimal, InvalidOperation
from typing import Any

from episodic.core.pricing import MAX_QUANTITY, MILLION


def compute_us_of(job: dict[str, Any], field: str = "predict_time") -> int | None:
    """The job's compute time in microseconds, from ``metrics.<field>`` (seconds:
    ``predict_time`` as Replicate and our http protocol report it, ``inference_time`` in
    fal's COMPLETED status); None when absent, null, not a finite number in range (0 to
    `MAX_QUANTITY` microseconds; old Replicate replies carry negative figures) or a boolean.
    Exact: the number's own decimal digits, rounded up to a whole microsecond, never
    through float arithmetic."""
    metrics = job.get("metrics")
    value = metrics.get(field) if isinstance(metrics, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        seconds = Decimal(repr(value))
    except InvalidOperation:
        return None
    if not seconds.is_finite() or seconds < 0:
        return None
    micros = int((seconds * MILLION).to_integral_value(rounding=ROUND_CEILING))
    return micros if micros <= MAX_QUANTITY else None
