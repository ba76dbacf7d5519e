"""The weekly flow publishes the week's spend (the ledger's, per profile and currency)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

from episodic.core.ids import WeekId
from episodic.core.money import format_money
from episodic.flows.artifacts import week_spend_key
from episodic.flows.weekly import weekly_episode
from tests.generation import provider_log, write_playlist

pytestmark = pytest.mark.slow

PROFILES = (
    "profiles:\n"
    '  fake:\n    kind: fake\n    price: {per_image: "0.04"}\n'
    '  euro:\n    kind: fake\n    price: {per_image: "0.003"}\n    currency: EUR\n'
)


def cards(flow_run_id: Any) -> dict[str, list[Any]]:
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    by_key: dict[str, list[Any]] = {}
    for card in found:
        by_key.setdefault(str(card.key), []).append(json.loads(str(card.data)))
    return by_key


def test_the_weekly_run_publishes_the_weeks_spend_per_profile_and_currency(
    harness: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))
    providers = tmp_path / "providers.yaml"
    providers.write_text(PROFILES)
    monkeypatch.setenv("EPISODIC_PROVIDERS_FILE", str(providers))
    # the calls are dated when they are paid (now): the episode's week is this week
    week = str(WeekId.of(datetime.now(UTC), UTC))
    runs = []
    for n, profile in enumerate(["fake", "euro"]):
        playlist = write_playlist(tmp_path / profile, ["a", "b"], profile=profile)
        state = weekly_episode(
            allocation_key=f"spend:{n}",
            week=week,
            playlist=str(playlist),
            wait_for_approval=False,
            return_state=True,
        )
        assert state.is_completed(), state
        runs.append(state.state_details.flow_run_id)
    bill: dict[str, int] = {}
    for event in provider_log():
        if event["event"] == "job_created":
            currency = "EUR" if event["episode_id"].endswith("-1") else "USD"
            bill[currency] = bill.get(currency, 0) + int(event["cost_micros"])
    assert bill == {"USD": 80_000, "EUR": 6_000}

    key = week_spend_key("weekly", week)
    first, last = cards(runs[0]), cards(runs[1])
    assert len(first[key]) == 1 and len(last[key]) == 1  # one card per run, updated in place
    (only,) = first[key][0][:1]
    assert (only["profile"], only["paid calls"], only["spent"]) == ("fake", 2, "0.08 USD")
    rows = last[key][0]
    assert [(r["profile"], r["currency"], r["paid calls"], r["spent"]) for r in rows] == [
        ("euro", "EUR", 2, format_money(bill["EUR"], "EUR")),
        ("fake", "USD", 2, format_money(bill["USD"], "USD")),
        ("(total)", "EUR", 2, "0.006 EUR"),
        ("(total)", "USD", 2, "0.08 USD"),
    ]
    assert all(r["week"] == week and r["in flight"] == 0 for r in rows)
