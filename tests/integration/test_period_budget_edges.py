"""A period budget holds against a reply's cost above the estimate, as --max-cost does
(tests/integration/test_budgets.py); dates and pipeline names given to the budget commands
are checked at the door."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sqlalchemy import Engine

from tests.http_server import PredictionsServer
from tests.integration.paid_episodes import ledger_micros as _ledger
from tests.integration.paid_episodes import planned_episodes as _episodes
from tests.integration.test_budgets import (
    _cli,
    _fake,
    free_profile_billed_in_replies,
)

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("episodes", [1, 4])
def test_a_free_profile_billed_in_its_reply_never_passes_the_weekly_budget(
    engine: Engine,
    database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    episodes: int,
) -> None:
    """A `free: true` profile whose HTTP provider bills 0.40 per image in its reply, a weekly
    budget of 0.80 and no --max-cost, three items at the default concurrency: the provider's
    bill never passes 0.80, on both backends. With four episodes' generates started
    together (four runs, each with its own probe), too."""
    with PredictionsServer(price_micros=400_000, report_cost=True) as server:
        free_profile_billed_in_replies(server, tmp_path, monkeypatch)
        ids = _episodes(engine, tmp_path, episodes, items=3)
        budget = _cli("pipelines", "set-budget", "weekly", "0.80", "--per", "week")
        assert budget.returncode == 0, budget
        with ThreadPoolExecutor(episodes) as pool:  # separate processes, started together
            ended = list(pool.map(lambda e: _cli("generate", e), ids))
        bill = server.bill_micros
        assert bill <= 800_000, (bill, [(d.returncode, d.stdout, d.stderr) for d in ended])
        assert {d.returncode for d in ended} <= {0, 7} and 7 in {d.returncode for d in ended}
        assert bill == _ledger(engine)


def test_spend_with_a_far_date_is_bad_input_not_an_unexpected_error(
    engine: Engine, database_url: str
) -> None:
    """`episodic spend --until 9999-12-31` is a valid YYYY-MM-DD day whose period end
    Python cannot represent: never 'unexpected OverflowError' (exit 1); bad or
    unrepresentable dates are one line and exit 2 (docs/cli.md#spend), or the report of
    everything."""
    assert _cli("pipelines", "set-budget", "weekly", "1.00", "--per", "week").returncode == 0
    far = _cli("spend", "--until", "9999-12-31")
    assert far.returncode in (0, 2), far
    assert "unexpected" not in far.stderr, far.stderr


def test_a_mistyped_pipeline_is_refused_rather_than_budgeted(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`set-budget weeklyy 5.00` would make a pipeline nobody runs and leave the real one
    without a budget. Refused in one line naming the known pipelines, nothing written;
    `--new` budgets a pipeline that has not run yet."""
    _fake(tmp_path, monkeypatch, "0.01")  # the profile `paid`: plan refuses an unknown one
    _episodes(engine, tmp_path, 1, items=1)  # the pipeline `weekly` is known
    typo = _cli("pipelines", "set-budget", "weeklyy", "5.00", "--per", "week")
    assert typo.returncode == 2 and "unknown pipeline 'weeklyy'" in typo.stderr, typo
    assert "weekly" in typo.stderr and len(typo.stderr.strip().splitlines()) == 1
    assert "weeklyy" not in _cli("pipelines", "list", "--json").stdout
    fresh = _cli("pipelines", "set-budget", "monthly-digest", "5.00", "--per", "week", "--new")
    assert fresh.returncode == 0, fresh
