"""Caps and period budgets hold against what the provider bills, also when it bills above the
price's estimate, counted at the provider's side (the server's own ``bill_micros``), on both
backends: runs one after another, concurrent processes released together, a run's cap with
concurrency, a size known before buying, a charge above the price's bound, and the billing
of failed jobs as the price states it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from episodic.core.exit_codes import ExitCode
from episodic.storage.budgets import BudgetStore
from tests.http_server import TOKEN as HTTP_TOKEN
from tests.http_server import PredictionsServer
from tests.integration import budget_workers as bw
from tests.integration import race_workers as w
from tests.integration.paid_episodes import ledger_micros, planned_episodes
from tests.integration.standin_cli import cli
from tests.jobs_servers import TOKEN, FalServer, ReplicateServer

pytestmark = pytest.mark.slow


def providers_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fields: str) -> None:
    """A providers.yaml whose one profile ``paid`` has `fields` (indented by 4)."""
    path = tmp_path / "providers.yaml"
    path.write_text(f"profiles:\n  paid:\n{fields}")
    monkeypatch.setenv("EPISODIC_PROVIDERS_FILE", str(path))
    monkeypatch.setenv("IMAGE_KEY", TOKEN)
    monkeypatch.setenv("TEST_IMAGE_TOKEN", HTTP_TOKEN)


def http_fields(server: PredictionsServer, price: str) -> str:
    return (
        f"    kind: http\n    base_url: {server.base_url}\n    credential_env: TEST_IMAGE_TOKEN\n"
        f"    price: {price}\n    timeout_s: 5.0\n    poll_interval_s: 0.02\n"
        "    max_concurrency: 64\n"
    )


def replicate_fields(server: ReplicateServer, price: str) -> str:
    return (
        "    kind: replicate\n    model: black-forest-labs/flux-schnell\n"
        f"    base_url: {server.base_url}\n    credential_env: IMAGE_KEY\n"
        f"    price: {price}\n    timeout_s: 5.0\n    poll_interval_s: 0.02\n"
        "    max_concurrency: 64\n"
    )


def fal_fields(server: FalServer, price: str, inputs: str) -> str:
    return (
        "    kind: fal\n    model: fal-ai/flux/dev\n"
        f"    base_url: {server.base_url}\n    credential_env: IMAGE_KEY\n"
        f"    price: {price}\n    inputs: {inputs}\n    timeout_s: 5.0\n"
        "    poll_interval_s: 0.02\n"
    )


def weekly_budget(amount_micros: int) -> None:
    amount = f"{amount_micros // 1_000_000}.{amount_micros % 1_000_000:06d}"
    done = cli("pipelines", "set-budget", "weekly", amount, "--per", "week")
    assert done.returncode == 0, done


# (the server, the profile's fields): each bills a call above the price's estimate
# - per_image 0.05, the reply reports 0.08 (our http protocol reports the provider's figure)
# - per_second 0.01 at most 4 s (0.04), the prediction reports predict_time 4.5 s (0.045)
# - per_megapixel 0.02 at most 1 (0.02), the image is 2000x1000 (0.04)
ABOVE = {
    "per_image": 80_000,
    "per_second": 45_000,
    "per_megapixel": 40_000,
}


def above_the_estimate(basis: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The server of `basis` (not started) with the profile ``paid`` on it."""
    if basis == "per_image":
        http = PredictionsServer(price_micros=80_000, report_cost=True)
        providers_file(tmp_path, monkeypatch, http_fields(http, '{per_image: "0.05"}'))
        return http
    if basis == "per_second":
        rep = ReplicateServer(billing="per_second", price_micros=10_000, compute_s=4.5)
        price = '{per_second: "0.01", at_most: "4"}'
    else:
        rep = ReplicateServer(billing="per_megapixel", price_micros=20_000, size=(2000, 1000))
        price = '{per_megapixel: "0.02", at_most: "1"}'
    providers_file(tmp_path, monkeypatch, replicate_fields(rep, price))
    return rep


ESTIMATE = {"per_image": 50_000, "per_second": 40_000, "per_megapixel": 20_000}


@pytest.mark.parametrize("basis", sorted(ABOVE))
def test_runs_one_after_another_never_pass_the_weekly_budget_billed_above_the_estimate(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, basis: str
) -> None:
    """Three runs of one item one after another under a weekly budget that holds two of the
    provider's real charges and one estimate (0.22 for a 0.05 image billed 0.08): the
    provider's bill stays within the budget. Each of the first two runs is paused at its
    charge above the price's bound (exit 7, the charge named); the third is refused at the
    budget, counted at the charge the runs before it recorded, not at the estimate."""
    charge, estimate = ABOVE[basis], ESTIMATE[basis]
    server = above_the_estimate(basis, tmp_path, monkeypatch)
    with server:
        ids = planned_episodes(engine, tmp_path, 3, items=1)
        budget = 2 * charge + estimate + 2_000
        weekly_budget(budget)
        lines, codes = [], []
        for episode_id in ids:
            done = cli("generate", episode_id, "--json")
            codes.append(done.returncode)
            lines.append(json.loads(done.stdout)["message"])
            assert server.bill_micros <= budget, (basis, server.bill_micros, budget, lines)
        assert codes == [7, 7, 7], (codes, lines)
        assert server.bill_micros == ledger_micros(engine) == 2 * charge
        assert all("charge above the price" in line for line in lines[:2]), lines
        assert "budget reached" in lines[2], lines


def test_eight_generate_processes_billed_above_the_estimate_never_pass_the_budget(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight `episodic generate` processes released together by a Barrier, three items each,
    priced 0.05 per image and billed 0.08 by the provider's replies, under a weekly budget of
    1.00 (trials raise it by 1.00 each): the provider's bill never passes the budget, and the
    ledger equals it to the micro-unit."""
    with PredictionsServer(price_micros=80_000, report_cost=True) as server:
        providers_file(tmp_path, monkeypatch, http_fields(server, '{per_image: "0.05"}'))
        for trial in range(1, 4):
            ids = planned_episodes(engine, tmp_path / f"t{trial}", 8, items=3)
            weekly_budget(trial * 1_000_000)
            results = w.run_processes(
                [
                    (bw.cli_worker, (["generate", e, "--json", "--concurrency", "3"], {}))
                    for e in ids
                ]
            )
            for _args, code, out, err in results:
                assert code in (0, 2, 7), (code, out, err)
            assert server.bill_micros <= trial * 1_000_000, (trial, server.bill_micros)
            assert server.bill_micros == ledger_micros(engine)


def test_a_run_cap_with_concurrency_holds_billed_above_the_estimate(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--max-cost 0.15 --concurrency 2, priced 0.05 and billed 0.08: the provider's bill
    stays within 0.15, including for a second run whose first call must see the first
    run's charge."""
    with PredictionsServer(price_micros=80_000, report_cost=True) as server:
        providers_file(tmp_path, monkeypatch, http_fields(server, '{per_image: "0.05"}'))
        first, second = planned_episodes(engine, tmp_path, 2, items=3)
        done = cli("generate", first, "--max-cost", "0.15", "--concurrency", "2")
        assert done.returncode == 7, done
        assert server.bill_micros <= 150_000, server.bill_micros
        before = server.bill_micros
        again = cli("generate", second, "--max-cost", "0.15", "--concurrency", "2")
        assert again.returncode == 7, again
        assert server.bill_micros - before <= 150_000, server.bill_micros
        assert server.bill_micros == ledger_micros(engine)


def test_a_known_size_above_the_cap_is_refused_before_buying(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fal flux/dev with ``image_size: square_hd`` (1024x1024: two started megapixels) under
    0.025 per started megapixel, at most 1, and --max-cost 0.03: `--plan` and `generate`
    refuse in one line (exit 2), naming the size; the provider made nothing."""
    with FalServer(billing="per_whole_megapixel", price_micros=25_000) as server:
        price = '{per_megapixel: "0.025", whole_megapixels: true, at_most: "1"}'
        providers_file(tmp_path, monkeypatch, fal_fields(server, price, "{image_size: square_hd}"))
        (episode,) = planned_episodes(engine, tmp_path, 1, items=1)
        plan = cli("generate", episode, "--max-cost", "0.03", "--plan")
        assert plan.returncode == 2, plan
        lines = plan.stderr.strip().splitlines()
        assert len(lines) == 1 and "0.05" in lines[0], plan.stderr
        done = cli("generate", episode, "--max-cost", "0.03")
        assert done.returncode == 2, done
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert server.jobs == {} and server.bill_micros == 0
        shown = cli("generate", episode, "--max-cost", "0.10", "--plan")
        assert shown.returncode == 0, shown
        assert "image_size square_hd (1024x1024)" in shown.stdout + shown.stderr, shown


def test_a_charge_above_the_price_bound_pauses_the_run_and_is_a_check_finding(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Replicate per-megapixel price at most 1 megapixel whose images are 2000x1000: the
    first charge (0.04 against the 0.02 bound) pauses the run at once (exit 7, the charge
    named in its line and `runs show`); `check` reports it; the provider billed no call
    sent after the charge was known."""
    server = ReplicateServer(billing="per_megapixel", price_micros=20_000, size=(2000, 1000))
    with server:
        price = '{per_megapixel: "0.02", at_most: "1"}'
        providers_file(tmp_path, monkeypatch, replicate_fields(server, price))
        (episode,) = planned_episodes(engine, tmp_path, 1, items=6)
        done = cli("generate", episode, "--concurrency", "1", "--json")
        assert done.returncode == 7, done
        reply = json.loads(done.stdout)
        assert "charge above the price" in reply["message"], reply
        assert "0.04 USD" in reply["message"], reply
        assert server.bill_micros == 40_000 == ledger_micros(engine)  # one call, then no more
        shown = cli("runs", "show", reply["run_id"])
        assert "charge above the price" in shown.stdout, shown
        check = cli("check", episode)
        assert check.returncode != 0, check
        assert "above" in check.stdout + check.stderr, check


def test_a_failed_prediction_of_a_model_billed_by_output_is_not_charged(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replicate bills its official models by output: a prediction that ends ``failed`` is
    not billed, and the ledger records no cost for it; the ledger equals the bill."""
    with ReplicateServer(billing="per_image", price_micros=3_000) as server:
        providers_file(tmp_path, monkeypatch, replicate_fields(server, '{per_image: "0.003"}'))
        (episode,) = planned_episodes(
            engine, tmp_path, 1, items=2, prompt="{title} [[REMOTE_FAIL]] part {part}"
        )
        done = cli("generate", episode)
        assert done.returncode == ExitCode.RUN_FAILED, done
        assert server.bill_micros == 0 == ledger_micros(engine)


def test_cancelled_predictions_nobody_polls_stop_counting_against_the_budget(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two Replicate predictions of a model billed by output, left accepted by a run whose
    collect gave up, then `runs cancel`: the provider answers ``canceled`` (not billed), so
    their reservations stop counting against the weekly budget at once, and the ledger
    records no cost for them; the provider billed nothing."""
    with ReplicateServer(billing="per_image", price_micros=3_000, processing_polls=10**6) as server:
        providers_file(tmp_path, monkeypatch, replicate_fields(server, '{per_image: "0.003"}'))
        (episode,) = planned_episodes(engine, tmp_path, 1, items=2)
        weekly_budget(1_000_000)
        done = cli("generate", episode, "--collect-timeout", "1", "--json")
        run_id = json.loads(done.stdout)["run_id"]
        (standing,) = BudgetStore(engine).standing("weekly")
        assert standing[5] == 6_000, standing  # two calls in flight at 0.003
        cancelled = cli("runs", "cancel", run_id)
        assert cancelled.returncode == 0, cancelled
        (standing,) = BudgetStore(engine).standing("weekly")
        assert standing[4:] == (0, 0), standing
        assert server.bill_micros == 0 == ledger_micros(engine)
