"""Caps and period budgets hold against what the provider bills, proven against the stand-ins
of Replicate's and fal's APIs (tests/standins, written from their public documentation) and
counted only from the stand-in's own bill (``bill_micros``, ``bills``, ``jobs_made_total``,
``create_calls``), on SQLite and PostgreSQL, through the real `episodic` command:

- runs one after another under a weekly budget, a Replicate model billed by compute time whose
  predictions report a ``predict_time`` above the price's ``at_most``;
- a fal size known before buying (the ``square_hd`` preset, a ``{width, height}`` size) priced
  at the started megapixels it bills, refused in one line under ``--max-cost`` before anything
  is made, bought at its real price under a cap that holds it;
- a Replicate official model (billed per output image) whose prediction ends ``failed``: nothing
  billed, nothing in the ledger;
- cancelled predictions nobody polls again stop counting against the weekly budget;
- concurrent `episodic generate` processes released together by a Barrier under one budget.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import Engine

from episodic.core.exit_codes import ExitCode
from tests.integration import budget_workers as bw
from tests.integration import race_workers as w
from tests.integration.paid_episodes import ledger_micros, planned_episodes
from tests.integration.standin_cli import cli, fal_profile, replicate_profile
from tests.standins import FalStandIn, ReplicateStandIn
from tests.standins import fal as fal_standin
from tests.standins import replicate as replicate_standin

pytestmark = pytest.mark.slow

# A hardware-priced Replicate model: 0.01 a second, the profile says at most 4 s (0.04), the
# predictions report 4.5 s (the stand-in bills 0.045).
PER_SECOND_PRICE = '{per_second: "0.01", at_most: "4"}'
ESTIMATE = 40_000
CHARGE = 45_000


def providers_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, profiles: dict[str, str]
) -> None:
    """A providers.yaml of `profiles` (id -> fields indented by 4), with both stand-ins' keys."""
    path = tmp_path / "providers.yaml"
    path.write_text("profiles:\n" + "".join(f"  {n}:\n{f}" for n, f in profiles.items()))
    monkeypatch.setenv("EPISODIC_PROVIDERS_FILE", str(path))
    monkeypatch.setenv("REPLICATE_KEY", replicate_standin.TOKEN)
    monkeypatch.setenv("FAL_KEY", fal_standin.TOKEN)


def set_budget(pipeline: str, amount_micros: int) -> None:
    amount = f"{amount_micros // 1_000_000}.{amount_micros % 1_000_000:06d}"
    done = cli("pipelines", "set-budget", pipeline, amount, "--per", "week")
    assert done.returncode == 0, done


def refused_before_buying(
    server: FalStandIn, episode: str, cap: str
) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    """`generate --plan` and `generate` of `episode` under ``--max-cost`` `cap`, each refused
    in one line, exit 2, with no submit at the stand-in; both results, plan first."""
    plan = cli("generate", episode, "--max-cost", cap, "--plan")
    assert plan.returncode == ExitCode.REFUSED, plan
    assert len(plan.stderr.strip().splitlines()) == 1, plan.stderr
    done = cli("generate", episode, "--max-cost", cap)
    assert done.returncode == ExitCode.REFUSED, done
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert server.create_calls == 0 and server.jobs_made_total == 0
    return plan, done


def test_runs_one_after_another_never_pass_the_weekly_budget_at_the_stand_in(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three runs of one item one after another under a weekly budget that holds two of the
    stand-in's real charges (0.045) and one estimate (0.04): after every run the stand-in's
    bill is within the budget; the third run is refused at the budget because it counts its
    call at the charge the runs before it were billed, not at the estimate."""
    server = ReplicateStandIn(billing="per_second", price_micros=10_000, predict_time=4.5)
    with server:
        providers_file(
            tmp_path,
            monkeypatch,
            {"paid": replicate_profile(server, PER_SECOND_PRICE, max_concurrency=64)},
        )
        ids = planned_episodes(engine, tmp_path, 3, items=1)
        budget = 2 * CHARGE + ESTIMATE + 2_000
        set_budget("weekly", budget)
        lines = []
        for episode_id in ids:
            done = cli("generate", episode_id, "--json")
            lines.append((done.returncode, done.stdout.strip()[-300:], done.stderr[-300:]))
            assert server.bill_micros <= budget, (server.bills, budget, lines)
        assert server.jobs_made_total == 2, (server.jobs_made, lines)
        assert server.bill_micros == 2 * CHARGE == ledger_micros(engine), (server.bills, lines)
        assert lines[2][0] == ExitCode.BUDGET_REACHED and "budget" in lines[2][1], lines


def test_a_preset_size_above_the_cap_is_refused_before_anything_is_made_at_the_stand_in(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fal flux/dev with ``image_size: square_hd`` (1024x1024: two started megapixels, 0.05)
    under a price of one megapixel at most and --max-cost 0.03: `--plan` and `generate` each
    refuse in one line, exit 2 (docs/cli.md: refused before any work, budget guard); the
    stand-in received no submit and billed nothing."""
    server = FalStandIn(price_micros=25_000)
    with server:
        providers_file(
            tmp_path, monkeypatch, {"paid": fal_profile(server, "{image_size: square_hd}")}
        )
        (episode,) = planned_episodes(engine, tmp_path, 1, items=1)
        _plan, done = refused_before_buying(server, episode, "0.03")
        assert "Traceback" not in done.stderr
        assert server.bill_micros == 0 == ledger_micros(engine)


def test_width_and_height_inputs_are_priced_before_buying_at_the_stand_in(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fal profile whose inputs ask for 2000x1000 (two started megapixels, 0.05, although
    the price says one megapixel at most, 0.025) under --max-cost 0.04: `--plan` and
    `generate` refuse in one line before buying (exit 2); the stand-in received no submit.
    (fal's own form of such a size, the ``image_size: {width, height}`` object, is the next
    test.)"""
    server = FalStandIn(price_micros=25_000)
    with server:
        inputs = "{width: 2000, height: 1000}"
        providers_file(tmp_path, monkeypatch, {"paid": fal_profile(server, inputs)})
        (episode,) = planned_episodes(engine, tmp_path, 1, items=1)
        plan, _done = refused_before_buying(server, episode, "0.04")
        assert "0.05" in plan.stderr, plan
        assert server.bill_micros == 0 == ledger_micros(engine)


def test_an_image_size_object_is_priced_before_buying_and_sent_as_fals_object(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fal profile whose inputs state ``image_size: {width: 2000, height: 1000}`` (two
    started megapixels, 0.05, although the price says one megapixel at most) under --max-cost
    0.04: `--plan` and `generate` refuse in one line before buying (exit 2), nothing submitted;
    under --max-cost 0.05 it is bought: the stand-in received the object as fal documents it
    and billed two started megapixels, which is what the ledger records."""
    server = FalStandIn(price_micros=25_000)
    size = {"width": 2000, "height": 1000}
    with server:
        inputs = "{image_size: {width: 2000, height: 1000}}"
        providers_file(tmp_path, monkeypatch, {"paid": fal_profile(server, inputs)})
        (episode,) = planned_episodes(engine, tmp_path, 1, items=1)
        plan, _done = refused_before_buying(server, episode, "0.04")
        assert "0.05" in plan.stderr, plan
        bought = cli("generate", episode, "--max-cost", "0.05")
        assert bought.returncode == 0, bought
        assert [seen.json["image_size"] for seen in server.create_requests] == [size]
        assert server.jobs_with(image_size=size) == 1 == server.jobs_made_total
        assert server.bill_micros == 50_000 == ledger_micros(engine), server.bills


def test_a_failed_prediction_of_an_official_model_costs_nothing_at_the_stand_in_or_ledger(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replicate bills its official models per output image: a prediction that ends
    ``failed`` with no output is billed nothing by the stand-in, and the ledger records no cost
    for it (the profile's price, 0.003 an image, is not a failed job's charge); the other
    item of the run is bought and billed once."""
    server = ReplicateStandIn(billing="per_output_image", price_micros=3_000)
    with server:
        server.script("doomed", status="failed", error="CUDA out of memory")
        providers_file(
            tmp_path, monkeypatch, {"paid": replicate_profile(server, max_concurrency=64)}
        )
        ids = planned_episodes(engine, tmp_path, 1, items=1, prefix="doomed ")
        ids += planned_episodes(engine, tmp_path / "fine", 1, items=1, prefix="fine ")
        failed = cli("generate", ids[0])
        assert failed.returncode == ExitCode.RUN_FAILED, failed
        assert server.jobs_made_total == 1
        assert server.bills == {} and ledger_micros(engine) == 0
        bought = cli("generate", ids[1])
        assert bought.returncode == ExitCode.OK, bought
        assert server.jobs_made_total == 2
        assert server.bill_micros == 3_000 == ledger_micros(engine), server.bills


def test_cancelled_predictions_nobody_polls_again_stop_counting_against_the_weekly_budget(
    engine: Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An official model (billed per output image, 0.003) under a weekly budget of four
    images: one image bought first (the price's charge is on record), then three predictions
    that run until cancelled, left accepted by a run whose collect gave up; `runs cancel`
    cancels them at the stand-in (``canceled``: not billed) and nobody polls them again. A
    following run then buys up to the budget (three images), and the stand-in's bill is the
    budget, never above it."""
    server = ReplicateStandIn(billing="per_output_image", price_micros=3_000)
    with server:
        server.script("stuck", polls=None)
        providers_file(
            tmp_path, monkeypatch, {"paid": replicate_profile(server, max_concurrency=64)}
        )
        (first,) = planned_episodes(engine, tmp_path / "first", 1, items=1, prefix="first ")
        (stuck,) = planned_episodes(engine, tmp_path, 1, items=3, prefix="stuck ")
        (later,) = planned_episodes(engine, tmp_path / "later", 1, items=3, prefix="later ")
        budget = 4 * 3_000
        set_budget("weekly", budget)
        assert cli("generate", first).returncode == ExitCode.OK
        assert server.bill_micros == 3_000
        gave_up = cli("generate", stuck, "--concurrency", "3", "--collect-timeout", "1", "--json")
        run_id = json.loads(gave_up.stdout)["run_id"]
        assert server.jobs_with(prompt="cover for stuck e0i0 part 1") == 1, gave_up
        assert server.jobs_made_total == 1 + 3, (server.jobs_made, gave_up)
        stuck_ids = {p.id for p in server.predictions.values() if "stuck" in p.sent_input["prompt"]}
        cancelled = cli("runs", "cancel", run_id)
        assert cancelled.returncode == ExitCode.OK, cancelled
        assert set(server.cancels) == stuck_ids, server.cancels
        assert server.bill_micros == 3_000 == ledger_micros(engine)
        seen_before = len(server.requests)
        following = cli("generate", later, "--json")
        assert following.returncode == ExitCode.OK, following
        assert server.jobs_made_total == 1 + 3 + 3, server.jobs_made
        assert server.bill_micros == budget == ledger_micros(engine), server.bills
        polled_again = [
            seen
            for seen in server.requests[seen_before:]
            if seen.path.split("?")[0].rsplit("/", 1)[-1] in stuck_ids
        ]
        assert polled_again == []


@pytest.mark.parametrize("processes", [4])
def test_concurrent_generate_processes_never_pass_the_budget_at_the_stand_in(
    engine: Engine,
    database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    processes: int,
) -> None:
    """`processes` `episodic generate` processes, three items each and concurrency 3,
    released together by a Barrier against one Replicate stand-in that bills 0.045 for a call
    the profile estimates at 0.04, under one weekly budget of 0.20 (room for five estimates,
    four charges). Each trial starts cold: a pipeline and a provider profile of its own, so no
    charge of that price is on record when the processes start. The stand-in's bill is within
    the budget in every trial, and the ledger equals it."""
    server = ReplicateStandIn(billing="per_second", price_micros=10_000, predict_time=4.5)
    budget = 200_000
    trials = 3
    with server:
        providers_file(
            tmp_path,
            monkeypatch,
            {
                f"paid{t}": replicate_profile(server, PER_SECOND_PRICE, max_concurrency=64)
                for t in range(trials)
            },
        )
        for trial in range(trials):
            pipeline, profile = f"storm{trial}", f"paid{trial}"
            ids = planned_episodes(
                engine, tmp_path / f"t{trial}", processes, 3, pipeline=pipeline, profile=profile
            )
            set_budget(pipeline, budget)
            before = server.bill_micros
            env = {"EPISODIC_PIPELINE": pipeline}
            results = w.run_processes(
                [
                    (bw.cli_worker, (["generate", e, "--json", "--concurrency", "3"], env))
                    for e in ids
                ]
            )
            for _args, code, out, err in results:
                assert code in (0, 2, 7), (code, out, err)
            billed = server.bill_micros - before
            assert 0 < billed <= budget, (trial, billed, budget)
            assert server.bill_micros == ledger_micros(engine), (trial, server.bills)
