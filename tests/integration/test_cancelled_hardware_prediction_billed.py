"""A prediction of a Replicate model billed by hardware time is billed for the time it ran
when it is cancelled (docs/providers.md: ``canceled`` is billed at ``metrics.predict_time``
for ``per_second``). `episodic runs cancel` of a run whose collect gave up on such a
prediction records what the stand-in billed, and the call stops counting as in flight.
Counted at the Replicate stand-in's side (its own bill), through the real `episodic` command
on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from episodic.core.exit_codes import ExitCode
from tests.integration.standin_cli import cli, planned, replicate_profile
from tests.standins import ReplicateStandIn
from tests.standins import replicate as replicate_standin

pytestmark = pytest.mark.slow


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, database_url: str) -> Iterator[Path]:
    """The state folder; the ledger is the `database_url` fixture's (SQLite, PostgreSQL)."""
    monkeypatch.setenv("EPISODIC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("EPISODIC_PROVIDERS_FILE", str(tmp_path / "providers.yaml"))
    monkeypatch.setenv("REPLICATE_KEY", replicate_standin.TOKEN)
    yield tmp_path


def test_a_cancelled_per_second_prediction_is_recorded_at_what_the_provider_billed(
    home: Path, engine: Engine
) -> None:
    """0.01 a second; the prediction runs until cancelled and reports 0.25 s: the stand-in
    bills 0.0025 for it once `runs cancel` cancels it. The ledger then holds exactly that
    charge and `spend --json` counts no call in flight (its reservation is released)."""
    server = ReplicateStandIn(billing="per_second", price_micros=10_000)
    with server:
        server.script("slow", polls=None, predict_time=0.25)
        price = '{per_second: "0.01", at_most: "4"}'
        episode = planned(home, replicate_profile(server, price), ["slow"])
        gave_up = cli("generate", episode, "--collect-timeout", "1", "--json")
        run_id = json.loads(gave_up.stdout)["run_id"]
        cancelled = cli("runs", "cancel", run_id)
        assert cancelled.returncode == ExitCode.OK, cancelled
        assert server.bill_micros == 2_500, server.bills
        with engine.connect() as db:
            recorded = db.execute(
                text("SELECT COALESCE(SUM(amount_micros), 0) FROM cost_entries")
            ).scalar_one()
        spent = cli("spend", "--json")
        assert recorded == server.bill_micros, (recorded, server.bills, cancelled.stdout)
        totals = json.loads(spent.stdout)["totals"]
        assert [t["in_flight_calls"] for t in totals] == [0], totals
