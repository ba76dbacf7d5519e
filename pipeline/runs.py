"""Planning a paid generation run (DESIGN 5): options, the plan, the budget guard, creation.

Plain Python, no Prefect. Execution lives in `pipeline.engine`.
"""

from __future__ import annotations

import hashlib
import os
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from core.dedup import (
    Admission,
    RunRequest,
    check_dedup_options,
    parse_batch_id,
    parse_idempotency_key,
)
from core.errors import BudgetExceeded, CommandNotAllowed
from core.exit_codes import ExitCode
from core.hints import hint
from core.money import format_minor
from core.playlist import PlannedItem
from core.runs import ItemSnapshot, PlanReport, RunCounts
from core.settings import Settings
from core.states import ItemState, RunState, SubmissionState
from pipeline.gate import GatePass
from providers.profiles import Profile
from storage.admission import AdmissionStore, DedupPolicy
from storage.base import utcnow
from storage.plans import PlanRecord, PlanStore
from storage.runs import RunStore

DEFAULT_LEASE_S = 30.0
DEFAULT_COLLECT_TIMEOUT_S = 600.0


@dataclass(frozen=True, slots=True)
class RunOptions:
    only: frozenset[int] | None = None
    concurrency: int = 4
    max_retries: int = 2
    max_images: int | None = None
    max_cost_minor: int | None = None
    lease_s: float = DEFAULT_LEASE_S  # a claim lives this long without a heartbeat
    force_resubmit: bool = False
    # how long an accepted job is collected (polled, downloaded) before the item is left
    # for the next run to collect, at no cost
    collect_timeout_s: float = DEFAULT_COLLECT_TIMEOUT_S
    # EPISODIC_MAX_RUN_COST in minor units: applies when neither max_images nor max_cost is
    # given (a 100,000-image playlist never starts by default)
    cap_minor: int | None = None

    @property
    def max_attempts(self) -> int:
        """Paid calls an item may get, counted across runs (the first one and its retries)."""
        return self.max_retries + 1

    def params(self) -> dict[str, Any]:
        return {
            "only": sorted(self.only) if self.only is not None else None,
            "concurrency": self.concurrency,
            "max_retries": self.max_retries,
            "max_images": self.max_images,
            "max_cost_minor": self.max_cost_minor,
            "lease_s": self.lease_s,
            "force_resubmit": self.force_resubmit,
            "collect_timeout_s": self.collect_timeout_s,
        }

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> RunOptions:
        only = params.get("only")
        return cls(
            only=frozenset(only) if only is not None else None,
            concurrency=params["concurrency"],
            max_retries=params["max_retries"],
            max_images=params.get("max_images"),
            max_cost_minor=params.get("max_cost_minor"),
            lease_s=float(params.get("lease_s", DEFAULT_LEASE_S)),
            force_resubmit=params.get("force_resubmit", False),
            collect_timeout_s=float(params.get("collect_timeout_s", DEFAULT_COLLECT_TIMEOUT_S)),
        )


# ---------------------------------------------------------------------------- planning
def classify(snapshot: ItemSnapshot | None, options: RunOptions, now: datetime) -> str:
    """new | skip | busy | collect | reconcile | retry | exhausted (DESIGN 5 planning rules).

    Advisory: what a run *would* do. The claim (`storage.claims`) decides atomically.
    """
    if snapshot is None:
        return "new"
    if snapshot.state == ItemState.COMPLETED:
        return "skip"
    if snapshot.held(now):  # a live claim: its holder finishes it
        return "busy"
    # pending, cancelled, failed, or running under an expired claim (its holder died)
    if snapshot.open_submission == SubmissionState.ACCEPTED:
        return "collect"
    if snapshot.open_submission in (SubmissionState.INTENT, SubmissionState.UNKNOWN):
        return "reconcile"
    if snapshot.attempts >= options.max_attempts:
        return "exhausted"
    return "new" if snapshot.attempts == 0 else "retry"


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
    tally = dict.fromkeys(("new", "skip", "busy", "collect", "reconcile", "retry", "exhausted"), 0)
    new_keys: list[str] = []
    reuse_keys: list[str] = []
    hero_calls = 0
    for item in selected:
        snapshot = snapshots.get(item.idempotency_key)
        if snapshot is not None and snapshot.state == ItemState.COMPLETED:
            tally["skip"] += 1  # the bulk of a resume: no further rule applies
            continue
        kind = classify(snapshot, options, now)
        tally[kind] += 1
        hero_calls += item.candidate is not None and kind in ("new", "retry")
        # busy: followed; exhausted: a member, so the run cannot end "completed" while it
        # stays failed (the engine does not run it)
        (new_keys if snapshot is None else reuse_keys).append(item.idempotency_key)
    paid = tally["new"] + tally["retry"]
    return PlanReport(
        new_calls=paid,
        skipped=tally["skip"],
        busy=tally["busy"],
        to_collect=tally["collect"],
        to_reconcile=tally["reconcile"],
        exhausted=tally["exhausted"],
        estimated_cost_minor=paid * profile.cost_per_image_minor,
        currency=profile.currency,
        new_keys=tuple(new_keys),
        reuse_keys=tuple(reuse_keys),
        hero_calls=hero_calls,
    )


def check_budget(report: PlanReport, options: RunOptions) -> None:
    """Refuse (`BudgetExceeded`, exit 2, nothing written) a plan above --max-images,
    --max-cost, or, when neither is given, the configured per-run cap."""
    unlimited = options.max_images is None and options.max_cost_minor is None
    cap = options.cap_minor
    if unlimited and cap is not None and report.estimated_cost_minor > cap:
        raise BudgetExceeded(
            f"plan: {report.new_calls} new paid calls, estimated "
            f"{format_minor(report.estimated_cost_minor, report.currency)}, above the "
            f"per-run cap EPISODIC_MAX_RUN_COST ({format_minor(cap, report.currency)}); pass "
            "--max-cost or --max-images to allow it (or raise the cap); nothing was created"
        )
    _check_limits(report, options)


def _check_limits(report: PlanReport, options: RunOptions) -> None:
    if options.max_images is not None and report.new_calls > options.max_images:
        raise BudgetExceeded(
            f"plan needs {report.new_calls} new paid calls, --max-images allows "
            f"{options.max_images}; nothing was created"
        )
    if options.max_cost_minor is not None and report.estimated_cost_minor > options.max_cost_minor:
        raise BudgetExceeded(
            f"plan would cost {report.estimated_cost_minor / 100:.2f} {report.currency}, "
            f"--max-cost allows {options.max_cost_minor / 100:.2f}; nothing was created"
        )


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
        "max_cost_minor": options.max_cost_minor,
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
    request writes nothing). An active run of the same request (DESIGN 6) is reused and the
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


def nothing_to_do(gate: GatePass, report: PlanReport, options: RunOptions) -> RunOutcome:
    """The answer when no run was needed: every item completed, or the rest out of retries."""
    if report.exhausted:
        code = ExitCode.PARTIAL if report.skipped else ExitCode.RUN_FAILED
        message = (
            f"{gate.episode_id}: {report.exhausted} items failed {options.max_attempts} times "
            "and are out of retries; "
            + hint(
                f"run `episodic generate {gate.episode_id} --max-retries "
                f"{options.max_retries + 1}` to allow another paid attempt",
                f"run the generate deployment with max_retries={options.max_retries + 1} to "
                "allow another paid attempt",
            )
        )
        return RunOutcome(None, RunState.FAILED, code, RunCounts(), report.skipped, message)
    message = f"{gate.episode_id}: all {report.skipped} items already completed; nothing to do"
    return RunOutcome(None, RunState.COMPLETED, ExitCode.OK, RunCounts(), report.skipped, message)


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


@dataclass(frozen=True, slots=True)
class RunOutcome:
    run_id: str | None  # None: nothing to do, no run was created
    state: RunState
    exit_code: ExitCode
    counts: RunCounts
    skipped: int
    message: str
    followed: tuple[str, ...] = ()  # other runs whose claims this run waited for
    deduplicated: bool = False  # the run already existed for the same request: joined

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "deduplicated": self.deduplicated,
            "state": self.state.value,
            "exit_code": int(self.exit_code),
            "skipped": self.skipped,
            "message": self.message,
            "followed_runs": list(self.followed),
            **self.counts.to_dict(),
        }


def write_atomically(path: Path, content: bytes) -> str:
    """Write `content` to `path` via a temporary file and rename; returns its sha256 (hex)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_bytes(content)
    os.replace(tmp, path)
    return hashlib.sha256(content).hexdigest()
