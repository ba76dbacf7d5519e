"""The generate flow is held to its caps by money spent, as the CLI is: a run
stopped at --max-cost ends the flow run failed with the budget's message, and the provider
(the fake's own log) never billed more than the limit."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text

from episodic.core.ids import WeekId
from episodic.flows.generate import generate_episode
from episodic.pipeline.allocation import allocate
from episodic.pipeline.episode_plan import record_plan
from episodic.storage.engine import make_engine
from tests.generation import write_playlist
from tests.http_server import PredictionsServer
from tests.integration.test_budgets import free_profile_billed_in_replies

pytestmark = pytest.mark.slow


def test_the_flow_stops_buying_at_its_max_cost(
    harness: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `free: true` profile whose HTTP provider bills 0.40 per image in its replies, six
    items, max_cost 0.80: the flow run fails with the budget's message, the provider billed
    0.80 and the ledger says the same; the run is paused, stopped buying."""
    with PredictionsServer(price_micros=400_000, report_cost=True) as server:
        free_profile_billed_in_replies(server, tmp_path, monkeypatch)
        engine = make_engine(harness)
        try:
            episode = str(
                allocate(engine, "weekly", WeekId.parse("2026-W32"), "k-budget").episode.episode_id
            )
            titles = [f"t{n}" for n in range(6)]
            record_plan(
                engine, "weekly", episode, write_playlist(tmp_path / "p", titles, profile="paid")
            )
            state = generate_episode(episode_id=episode, max_cost="0.80", return_state=True)
            assert state.is_failed() and "budget reached" in str(state.message), state.message
            assert server.bill_micros == 800_000
            with engine.connect() as conn:
                spent = conn.execute(text("SELECT sum(amount_micros) FROM cost_entries")).scalar()
                paused = conn.execute(
                    text(
                        "SELECT count(*) FROM runs WHERE state = 'paused' AND "
                        "error_text LIKE 'stopped buying: budget reached:%'"
                    )
                ).scalar_one()
            assert int(spent) == 800_000 and paused == 1
        finally:
            engine.dispose()
