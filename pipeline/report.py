"""Episode-level truths for dashboards and artifacts: computed from the ledger, never from the
last run (a resume that pays nothing must not report "0 completed, 0.00 USD")."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Engine

from episodic.core.ids import EpisodeId
from episodic.core.money import add_to, format_money, format_totals
from episodic.pipeline.cancel import cancelled_answer, stopped
from episodic.pipeline.playlists import planned_items
from episodic.storage.cancels import CancelStore
from episodic.storage.episodes import EpisodeRepository
from episodic.storage.ledger import LedgerStore, completed_outputs
from episodic.storage.plans import PlanStore


def episode_report(
    engine: Engine,
    pipeline: str,
    episode_id: str,
    prices: Mapping[str, tuple[int, str]] | None = None,
) -> dict[str, Any]:
    """The episode's progress and spend.

    Returns ``{episode_id, pipeline, state, planned, completed, percent, paid_submissions,
    cost_micros, currency, cost, costs, accepted, still_running, cancelled_at_provider,
    committed_micros, committed}``: ``planned`` counts the current plan's paid images (0
    without a plan), ``completed`` those of them that are done, ``percent`` is 100.0 for a
    finished plan, and paid submissions and cost sum every run's ledger rows (micro-units;
    ``costs`` per currency, never summed across them; ``cost_micros`` and ``currency`` the
    episode's one currency, ``cost_micros`` None when it paid in several; ``cost`` the
    text, e.g. ``0.12 USD`` or ``0.12 USD + 0.50 EUR``). ``accepted`` counts the jobs the
    provider accepted that nobody collected yet: bought, so committed spend
    (``committed_micros``, ``committed``: the cost so far plus each of them at its
    profile's estimate in `prices`, profile id -> (micro-units, currency)); of them,
    ``cancelled_at_provider`` the ones a cancel stopped and ``still_running`` the ones the
    provider has not said stopped (a job that finished before the cancel is neither: the
    next run collects it). Raises `EpisodeNotFound`.
    """
    episode, pk = EpisodeRepository(engine).locate(pipeline, EpisodeId.parse(episode_id))
    plans = PlanStore(engine)
    ledger = LedgerStore(engine)
    cancels = CancelStore(engine)
    recorded = plans.latest_plan(pk)
    planned: set[str] = set()
    if recorded is not None:
        planned = {
            item.idempotency_key
            for item in planned_items(recorded[0], recorded[1], episode_id, pipeline)
        }
    done = sum(1 for o in completed_outputs(engine, pk) if o.idempotency_key in planned)
    paid, costs = ledger.episode_spend(pk)
    open_jobs = ledger.episode_open_jobs(pk)
    answers = cancels.provider_cancel_answers(pk) if open_jobs else {}
    halted = sum(1 for sub, _ in open_jobs if stopped(answers.get(sub, "")))
    cancelled = sum(1 for sub, _ in open_jobs if cancelled_answer(answers.get(sub, "")))
    committed = dict(costs)
    for _, profile in open_jobs:
        estimate, estimate_currency = (prices or {}).get(profile, (0, None))
        if estimate_currency is not None:
            add_to(committed, estimate_currency, estimate)
    single = next(iter(costs)) if len(costs) == 1 else None
    currency = single or (next(iter(committed)) if len(committed) == 1 else "USD")
    return {
        "episode_id": episode_id,
        "pipeline": pipeline,
        "state": episode.state,
        "planned": len(planned),
        "completed": done,
        "percent": 100.0 * done / len(planned) if planned else 0.0,
        "paid_submissions": paid,
        "cost_micros": costs.get(currency, 0) if len(costs) <= 1 else None,
        "currency": currency,
        "cost": format_totals(costs) if costs else format_money(0, currency),
        "costs": {c: costs[c] for c in sorted(costs)},
        "accepted": len(open_jobs),
        "still_running": len(open_jobs) - halted,
        "cancelled_at_provider": cancelled,
        "committed_micros": committed.get(currency, 0) if len(committed) <= 1 else None,
        "committed": format_totals(committed) if committed else format_money(0, currency),
    }
