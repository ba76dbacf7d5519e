"""One timezone truth per pipeline.

A pipeline's timezone decides which ISO week a slot belongs to, so every scheduler, worker and
CLI must use the same one. It lives in the database (`episodic.storage.pipelines`): the first use
records EPISODIC_TIMEZONE (UTC when unset); later, a process whose EPISODIC_TIMEZONE is set
to another zone refuses (`TimezoneMismatch`, exit 2) instead of allocating other weeks, and a
process without the variable simply uses the recorded zone. `set_timezone` is the only way
to change it.
"""

from __future__ import annotations

import re
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import Engine

from episodic.core.errors import InvalidInput, TimezoneMismatch
from episodic.core.money import amount_text, format_money, parse_money
from episodic.core.periods import PERIOD_KINDS, PeriodKind
from episodic.core.settings import Settings, load_timezone, validate_pipeline
from episodic.storage.budgets import BudgetStore
from episodic.storage.pipelines import PipelineConfig, PipelineStore


def pipeline_config(engine: Engine, settings: Settings, pipeline: str) -> PipelineConfig:
    """The pipeline's recorded settings (recorded now from this process's on first use).

    Raises `TimezoneMismatch` when EPISODIC_TIMEZONE is set and differs from the record.
    """
    name = validate_pipeline(pipeline)
    config, _ = PipelineStore(engine).ensure(name, settings.timezone)
    if settings.timezone_explicit and settings.timezone != config.timezone:
        raise TimezoneMismatch(name, config.timezone, settings.timezone)
    return config


def pipeline_timezone(engine: Engine, settings: Settings, pipeline: str) -> ZoneInfo:
    """The ZoneInfo weeks of `pipeline` are computed in (see `pipeline_config`)."""
    return load_timezone(pipeline_config(engine, settings, pipeline).timezone)


def set_timezone(engine: Engine, pipeline: str, timezone: str) -> dict[str, Any]:
    """Change the pipeline's recorded timezone (validated IANA name). Schedules created from
    the old zone must be redeployed (`episodic serve` / `prefect deploy --all`)."""
    name = validate_pipeline(pipeline)
    load_timezone(timezone)
    old, config = PipelineStore(engine).set_timezone(name, timezone)
    return {"pipeline": name, "timezone": config.timezone, "previous": old}


def set_budget(
    engine: Engine,
    settings: Settings,
    pipeline: str,
    per: str,
    amount: str | None,
    currency: str = "USD",
    *,
    new: bool = False,
) -> dict[str, Any]:
    """Record the pipeline's weekly or monthly budget (`amount` None: clear it). Every input
    is validated before anything is written (`InvalidInput`, exit 2): a plain decimal of at
    most six decimals, a known period, a currency code, a pipeline the database knows (or
    the configured one, or `new`: a mistyped name must not budget a pipeline nobody runs
    while the real one has none), and not below what the current period has already spent
    (the overrun is said, not hidden)."""
    name = validate_pipeline(pipeline)
    from episodic.storage.spend import known_pipelines

    known = known_pipelines(engine)
    if not new and name not in known and name != settings.pipeline and known:
        raise InvalidInput(
            f"unknown pipeline {name!r} (known: {', '.join(known)}); pass --new to budget a "
            "pipeline that has not run yet"
        )
    if per not in PERIOD_KINDS:
        raise InvalidInput(f"invalid period {per!r}: expected one of {', '.join(PERIOD_KINDS)}")
    period: PeriodKind = per
    if not re.fullmatch(r"[A-Z]{3}", currency):
        raise InvalidInput(f"invalid currency {currency!r}: expected a code such as USD or EUR")
    micros = None if amount is None else parse_money(amount, "budget")
    config = pipeline_config(engine, settings, name)
    spent, in_flight = BudgetStore(engine).set(name, period, micros, currency)
    return {
        "pipeline": name,
        "period": period,
        "amount": None if micros is None else amount_text(micros),
        "amount_micros": micros,
        "currency": currency,
        "timezone": config.timezone,
        "spent": amount_text(spent),
        "in_flight": amount_text(in_flight),
    }


def list_pipelines(engine: Engine) -> list[dict[str, Any]]:
    """Every pipeline with its timezone and its budgets (``budgets``: period → amount)."""
    budgets: dict[str, dict[str, dict[str, Any]]] = {}
    for b in BudgetStore(engine).list():
        budgets.setdefault(b.pipeline, {})[b.period] = {
            "amount": amount_text(b.amount_micros),
            "amount_micros": b.amount_micros,
            "currency": b.currency,
            "shown": format_money(b.amount_micros, b.currency),
        }
    return [
        {
            "pipeline": c.name,
            "timezone": c.timezone,
            "created_at": c.created_at.isoformat(),
            "updated_at": c.updated_at.isoformat(),
            "budgets": budgets.get(c.name, {}),
        }
        for c in PipelineStore(engine).list()
    ]
