"""One timezone truth per pipeline.

A pipeline's timezone decides which ISO week a slot belongs to, so every scheduler, worker and
CLI must use the same one. It lives in the database (`storage.pipelines`): the first use
records EPISODIC_TIMEZONE (UTC when unset); later, a process whose EPISODIC_TIMEZONE is set
to another zone refuses (`TimezoneMismatch`, exit 2) instead of allocating other weeks, and a
process without the variable simply uses the recorded zone. `set_timezone` is the only way
to change it.
"""

from __future__ import annotations

from typing import Any
from zoneinfo import ZoneInfo

from core.errors import TimezoneMismatch
from core.settings import Settings, load_timezone, validate_pipeline
from storage.pipelines import PipelineConfig, PipelineStore
from storage.tx import Database


def pipeline_config(engine: Database, settings: Settings, pipeline: str) -> PipelineConfig:
    """The pipeline's recorded settings (recorded now from this process's on first use).

    Raises `TimezoneMismatch` when EPISODIC_TIMEZONE is set and differs from the record.
    """
    name = validate_pipeline(pipeline)
    config, _ = PipelineStore(engine).ensure(name, settings.timezone)
    if settings.timezone_explicit and settings.timezone != config.timezone:
        raise TimezoneMismatch(name, config.timezone, settings.timezone)
    return config


def pipeline_timezone(engine: Database, settings: Settings, pipeline: str) -> ZoneInfo:
    """The ZoneInfo weeks of `pipeline` are computed in (see `pipeline_config`)."""
    return load_timezone(pipeline_config(engine, settings, pipeline).timezone)


def set_timezone(engine: Database, pipeline: str, timezone: str) -> dict[str, Any]:
    """Change the pipeline's recorded timezone (validated IANA name). Schedules created from
    the old zone must be redeployed (`episodic serve` / `prefect deploy --all`)."""
    name = validate_pipeline(pipeline)
    load_timezone(timezone)
    old, config = PipelineStore(engine).set_timezone(name, timezone)
    return {"pipeline": name, "timezone": config.timezone, "previous": old}


def list_pipelines(engine: Database) -> list[dict[str, Any]]:
    return [
        {
            "pipeline": c.name,
            "timezone": c.timezone,
            "created_at": c.created_at.isoformat(),
            "updated_at": c.updated_at.isoformat(),
        }
        for c in PipelineStore(engine).list()
    ]
