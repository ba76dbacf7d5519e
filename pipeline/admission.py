"""Plan → admitted run: the options a request asks for, what a run would do,
the request as dedup sees it, and the one way a generation run comes to exist.

Plain Python, no Prefect. The run itself is worked by `episodic.pipeline.runner`.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence

from sqlalchemy import Engine

from episodic.core.dedup import (
    Admission,
    RunRequest,
    check_dedup_options,
    parse_batch_id,
    parse_idempotency_key,
)
from episodic.core.errors import BudgetExceeded, CommandNotAllowed
from episodic.core.money import format_money
from episodic.core.planning import (
    PAID,
    Classification,
    GenerateRequest,
    RunOptions,
    check_budget,
    classify,
)
from episodic.core.playlist import PlannedItem
from episodic.core.runs import Item, PlanReport
from episodic.core.selection import parse_selection
from episodic.core.settings import Settings
from episodic.core.states import ItemState, RunState
from episodic.pipeline.gate import GatePass
from episodic.providers.profiles import Profile
from episodic.storage.admission import AdmissionStore, DedupPolicy
from episodic.storage.base import utcnow
from episodic.storage.budgets import BudgetStore
from episodic.storage.plans import PlanRecord, PlanStore
from episodic.storage.runs import RunStore


def options_from_request(
    settings: Settings, items: Sequence[PlannedItem], request: GenerateRequest
) -> RunOptions:
    """The `RunOptions` of a validated `request` for the planned `items`: its selection
    (`only`, "1,3-4" or "v03,v05") read against the plan's videos; the lease and the per-run
    cap (EPISODIC_MAX_RUN_COST) come from `settings`. Raises `InvalidInput` for a selection
    the plan does not have."""
    video_ids = {item.index: item.video_id for item in items}
    ordered = [video_ids.get(n, "") for n in range(1, max(video_ids) + 1)]
    only = request.only
    return RunOptions(
        only=parse_selection(only, ordered) if only is not None else None,  # "": refused
        concurrency=request.concurrency,
        max_retries=request.max_retries,
        max_images=request.max_images,
        max_cost_micros=request.max_cost_micros,
        lease_s=settings.lease_s,
        force_resubmit=request.force_resubmit,
        collect_timeout_s=float(request.collect_timeout_s),
        cap_micros=settings.max_run_cost_micros,
    )


def plan(
    plans: PlanStore,
    gate: GatePass,
    items: Sequence[PlannedItem],
    options: RunOptions,
    profile: Profile,
) -> PlanReport:
    """What a run would do; writes nothing. One query, however many items."""
    selected = [it for it in items if options.only is None or it.index in options.only]
    snapshots = plans.snapshots(gate.episode_pk)
    now = utcnow()
    tally = dict.fromkeys(Classification, 0)
    new_keys: list[str] = []
    reuse_keys: list[str] = []
    hero_calls = 0
    for item in selected:
        snapshot = snapshots.get(item.idempotency_key)
        if snapshot is not None and snapshot.state == ItemState.COMPLETED:
            tally[Classification.SKIP] += 1  # the bulk of a resume: no further rule applies
            continue
        kind = classify(snapshot, options, now)
        tally[kind] += 1
        hero_calls += item.candidate is not None and kind in PAID
        # busy: followed; exhausted: a member, so the run cannot end "completed" while it
        # stays failed (the runner does not run it)
        (new_keys if snapshot is None else reuse_keys).append(item.idempotency_key)
    paid = tally[Classification.NEW] + tally[Classification.RETRY]
    return PlanReport(
        new_calls=paid,
        skipped=tally[Classification.SKIP],
        busy=tally[Classification.BUSY],
        to_collect=tally[Classification.COLLECT],
        to_reconcile=tally[Classification.RECONCILE],
        exhausted=tally[Classification.EXHAUSTED],
        lost=tally[Classification.LOST],
        estimated_cost_micros=paid * profile.pricing.estimate_micros,
        currency=profile.currency,
        new_keys=tuple(new_keys),
        reuse_keys=tuple(reuse_keys),
        hero_calls=hero_calls,
    )


# What a run's process works on: everything but completed, exhausted and gone items.
_WORKED = frozenset(Classification) - {
    Classification.SKIP,
    Classification.EXHAUSTED,
    Classification.LOST,
}


def runnable_items(
    store: RunStore, plans: PlanStore, episode_pk: int, run_id: str, options: RunOptions
) -> list[Item]:
    """The run's items the planning rules still allow (a resume obeys them too). Raises
    `BudgetExceeded` when they need more new paid calls than --max-images allows."""
    candidates = store.run_items(
        run_id, [ItemState.PENDING, ItemState.FAILED, ItemState.RUNNING, ItemState.CANCELLED]
    )
    snapshots = plans.snapshots(episode_pk)
    now = utcnow()
    kinds = {it.pk: classify(snapshots.get(it.idempotency_key), options, now) for it in candidates}
    paid = sum(1 for it in candidates if kinds[it.pk] in PAID)
    if options.max_images is not None and paid > options.max_images:
        raise BudgetExceeded(
            f"run needs {paid} new paid calls, --max-images allows {options.max_images}; "
            "nothing was done"
        )
    return [it for it in candidates if kinds[it.pk] in _WORKED]


def dedup_policy(settings: Settings) -> DedupPolicy:
    """The dedup window, pending TTL and fallback lease from settings (seconds)."""
    return DedupPolicy(
        window_s=settings.dedup_window_s,
        pending_ttl_s=settings.pending_ttl_s,
        fallback_lease_s=settings.lease_s,
    )


def run_request(
    gate: GatePass,
    items: Sequence[PlannedItem],
    options: RunOptions,
    profile: Profile,
    *,
    idempotency_key: str | None = None,
    batch_id: str | None = None,
    allow_duplicate: bool = False,
) -> RunRequest:
    """The request as dedup sees it: what is generated (selection, plan digest, retry and
    cost limits, provider profile), not how fast (concurrency and lease are left out)."""
    check_dedup_options(idempotency_key, batch_id, allow_duplicate)
    keys = sorted(it.idempotency_key for it in items)
    params = {
        "only": sorted(options.only) if options.only is not None else None,
        "max_retries": options.max_retries,
        "max_images": options.max_images,
        "max_cost_micros": options.max_cost_micros,
        "force_resubmit": options.force_resubmit,
        "provider_profile": profile.id,
        "plan_sha256": hashlib.sha256(",".join(keys).encode()).hexdigest(),
    }
    return RunRequest(
        pipeline=gate.pipeline,
        episode_id=gate.episode_id,
        command=gate.command,
        params=params,
        idempotency_key=parse_idempotency_key(idempotency_key),
        batch_id=parse_batch_id(batch_id),
        allow_duplicate=allow_duplicate,
    )


def admit_run(
    admission: AdmissionStore,
    gate: GatePass,
    items: Sequence[PlannedItem],
    report: PlanReport,
    options: RunOptions,
    profile: Profile,
    request: RunRequest,
    policy: DedupPolicy,
    *,
    plan_id: int | None = None,
    replan: PlanRecord | None = None,
) -> Admission:
    """The one way a generation run comes to exist (CLI, Python API, Prefect flows).

    Call it last, after validation, the budget guard and the credential check (a refused
    request writes nothing). An active run of the same request is reused and the
    answer says ``deduplicated``; with nothing to do (every item completed or out of
    retries) no run is created and the answer has no run id.
    `plan_id`: the recorded plan `items` come from (the run is admitted for it, and refused
    if the episode was re-planned since); `replan`: a changed plan to record first, in the
    same transaction (`generate --hero-candidates`). ``Admission.plan_id`` is the run's plan.
    Raises `BudgetExceeded`, `IdempotencyKeyReused`, `CommandNotAllowed` (exit 2).
    """
    check_budget(report, options)
    new = set(report.new_keys)
    params = {**options.params(), "provider_profile": profile.id}
    return admission.admit(
        gate.episode_pk,
        request,
        params,
        [it for it in items if it.idempotency_key in new],
        report.reuse_keys,
        policy=policy,
        create=report.has_work,
        run_id=str(uuid.uuid4()),  # chosen once: a retry of the call finds the run it made
        plan_id=plan_id,
        replan=replan,
    )


# pending: its creator died before starting it; completed: answered with its outcome (a
# resume racing the run's last item must not fail)
JOINABLE_RUN_STATES = frozenset(
    {RunState.PENDING, RunState.PAUSED, RunState.FAILED, RunState.RUNNING, RunState.COMPLETED}
)


def prepare_resume(
    store: RunStore, admission: AdmissionStore, run_id: str, policy: DedupPolicy
) -> Admission:
    """A pending, paused or failed run resumes; a running one is joined (claims split its
    items); a completed one answers with its outcome.

    ``deduplicated`` is True when the run is alive (another process is working on it: this
    caller joins it); a running run whose lease expired (its process died) is taken over.
    Raises `CommandNotAllowed` for a completed or cancelled run, `RunNotFound`.
    """
    run = store.get_run(run_id)
    if RunState(run.state) not in JOINABLE_RUN_STATES:
        raise CommandNotAllowed(
            f"run {run_id} is {run.state}; only pending, paused, failed or running runs "
            "resume (`episodic retry EPISODE` asks again for a cancelled run's request)"
        )
    alive = RunState(run.state) == RunState.RUNNING and admission.join(run_id, policy)
    return Admission(run_id, deduplicated=alive)


def check_period_budgets(engine: Engine, pipeline: str, report: PlanReport) -> None:
    """Refuse (`BudgetExceeded`, exit 2, nothing created) a plan whose estimate alone would
    take a period budget of `pipeline` past what remains of it (spent and in flight
    counted), or whose currency is not the budget's. The claims hold the real spend."""
    if not report.new_calls:
        return
    for period, label, budget, currency, spent, in_flight in BudgetStore(engine).standing(pipeline):
        if currency != report.currency:
            raise BudgetExceeded(
                f"plan is priced in {report.currency}, pipeline {pipeline!r}'s {period}ly "
                f"budget is in {currency}: they are never summed; nothing was created"
            )
        if spent + in_flight + report.estimated_cost_micros > budget:
            left = max(0, budget - spent - in_flight)
            raise BudgetExceeded(
                f"plan would cost {format_money(report.estimated_cost_micros, currency)} "
                f"(estimated), above what remains of pipeline {pipeline!r}'s {period}ly "
                f"budget {format_money(budget, currency)} ({label}: spent "
                f"{format_money(spent, currency)}, {format_money(in_flight, currency)} in "
                f"flight, {format_money(left, currency)} left); nothing was created"
            )
