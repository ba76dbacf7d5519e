"""One timezone truth per pipeline, recorded in the database."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine

from episodic.core.errors import InvalidInput, TimezoneMismatch
from episodic.core.settings import Settings
from episodic.pipeline.pipelines import pipeline_config, set_timezone
from tests.integration import race_workers as w


def _settings(monkeypatch: pytest.MonkeyPatch, timezone: str | None) -> Settings:
    if timezone is None:
        monkeypatch.delenv("EPISODIC_TIMEZONE", raising=False)
    else:
        monkeypatch.setenv("EPISODIC_TIMEZONE", timezone)
    return Settings()


def test_the_first_use_records_the_zone_and_a_disagreeing_process_refuses(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    berlin = _settings(monkeypatch, "Europe/Berlin")
    assert pipeline_config(engine, berlin, "weekly").timezone == "Europe/Berlin"
    unset = _settings(monkeypatch, None)  # a worker without the variable: the record wins
    assert pipeline_config(engine, unset, "weekly").timezone == "Europe/Berlin"
    with pytest.raises(TimezoneMismatch, match="runs in Europe/Berlin"):
        pipeline_config(engine, _settings(monkeypatch, "UTC"), "weekly")
    assert pipeline_config(engine, unset, "other").timezone == "UTC"  # per pipeline


def test_only_an_explicit_change_moves_it(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    pipeline_config(engine, _settings(monkeypatch, None), "weekly")
    assert set_timezone(engine, "weekly", "America/New_York") == {
        "pipeline": "weekly",
        "timezone": "America/New_York",
        "previous": "UTC",
    }
    assert pipeline_config(engine, _settings(monkeypatch, None), "weekly").timezone == (
        "America/New_York"
    )
    with pytest.raises(InvalidInput, match="unknown timezone"):
        set_timezone(engine, "weekly", "Mars/Olympus")
    with pytest.raises(InvalidInput, match="invalid pipeline"):
        set_timezone(engine, "Weekly!", "UTC")


@pytest.mark.slow
def test_concurrent_first_uses_agree_on_one_zone(database_url: str) -> None:
    """Eight processes released together, each with its own EPISODIC_TIMEZONE: exactly one
    zone is recorded and every process is told the same one (or refuses)."""
    zones = ["UTC", "Europe/Berlin", "Asia/Tokyo", "America/New_York"] * 2
    for trial in range(5):
        results = w.run_processes(
            [(w.timezone_worker, (database_url, f"p{trial}", zone)) for zone in zones]
        )
        recorded = {r[1] for r in results if r[0] == "ok"}
        assert len(recorded) == 1, list(results)
        (zone,) = recorded
        for outcome, value, asked in results:
            assert (outcome == "ok") == (asked == zone), list(results)
            if outcome == "refused":
                assert f"runs in {zone}" in value
