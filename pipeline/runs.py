"""The run engine (DESIGN 5): plan, budget guard, execute, finish. Plain Python, no Prefect.

The CLI and the Prefect flow share it; they differ only in the `ItemExecutor` that runs the
per-item work (a thread pool here, cached Prefect tasks in `flows`).
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential_jitter

from core.errors import BudgetExceeded, CommandNotAllowed
from core.exit_codes import ExitCode
from core.playlist import PlannedItem
from core.runs import Item, ItemSnapshot, PlanReport, RunCounts
from core.states import (
    RESUMABLE_RUN_STATES,
    EpisodeState,
    ItemState,
    RunState,
    SubmissionState,
)
from pipeline.gate import GatePass
from providers.base import (
    ImageRequest,
    PermanentProviderError,
    Provider,
    ProviderError,
    Stopped,
    TransientProviderError,
    UnknownOutcome,
)
from providers.profiles import Profile
from storage.review import ReviewStore
from storage.runs import RunStore

INTERRUPTED = "interrupted"
RUNNABLE = frozenset({"new", "collect", "reconcile", "retry"})


@dataclass(frozen=True, slots=True)
class RunOptions:
    only: frozenset[int] | None = None
    concurrency: int = 4
    max_retries: int = 2
    max_images: int | None = None
    max_cost_minor: int | None = None
    stale_after_s: float = 900.0
    force_resubmit: bool = False
    collect_timeout_s: float = 600.0

    def params(self) -> dict[str, Any]:
        return {
            "only": sorted(self.only) if self.only is not None else None,
            "concurrency": self.concurrency,
            "max_retries": self.max_retries,
            "max_images": self.max_images,
            "max_cost_minor": self.max_cost_minor,
            "stale_after_s": self.stale_after_s,
            "force_resubmit": self.force_resubmit,
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
            stale_after_s=params.get("stale_after_s", 900.0),
            force_resubmit=params.get("force_resubmit", False),
        )


@dataclass(frozen=True, slots=True)
class RunOutcome:
    run_id: str
    state: RunState
    exit_code: ExitCode
    counts: RunCounts
    skipped: int
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "state": self.state.value,
            "exit_code": int(self.exit_code),
            "skipped": self.skipped,
            "message": self.message,
            **self.counts.to_dict(),
        }


# ---------------------------------------------------------------------------- planning
def classify(snapshot: ItemSnapshot | None, options: RunOptions, store: RunStore) -> str:
    """new | skip | busy | collect | reconcile | retry | exhausted (DESIGN 5 planning rules)."""
    if snapshot is None or snapshot.state in (ItemState.PENDING, ItemState.CANCELLED):
        return "new" if snapshot is None or snapshot.open_submission is None else "collect"
    if snapshot.state == ItemState.COMPLETED:
        return "skip"
    if snapshot.state == ItemState.RUNNING and not store.is_stale(
        snapshot.started_at, options.stale_after_s
    ):
        return "busy"
    # failed, or running past its time budget (treated as failed)
    if snapshot.open_submission == SubmissionState.ACCEPTED:
        return "collect"
    if snapshot.open_submission in (SubmissionState.INTENT, SubmissionState.UNKNOWN):
        return "retry" if options.force_resubmit else "reconcile"
    return "retry" if snapshot.attempts < options.max_retries + 1 else "exhausted"


def plan(
    store: RunStore,
    gate: GatePass,
    items: Sequence[PlannedItem],
    options: RunOptions,
    profile: Profile,
) -> PlanReport:
    """What a run would do; writes nothing. One query, however many items."""
    selected = [it for it in items if options.only is None or it.index in options.only]
    snapshots = store.snapshots(gate.episode_pk)
    tally = dict.fromkeys(("new", "skip", "busy", "collect", "reconcile", "retry", "exhausted"), 0)
    new_keys: list[str] = []
    reuse_keys: list[str] = []
    for item in selected:
        snapshot = snapshots.get(item.idempotency_key)
        if snapshot is not None and snapshot.state == ItemState.COMPLETED:
            tally["skip"] += 1  # the bulk of a resume: no further rule applies
            continue
        kind = classify(snapshot, options, store)
        tally[kind] += 1
        if kind in ("new", "collect", "retry", "reconcile"):
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
    )


def check_budget(report: PlanReport, options: RunOptions) -> None:
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


def create_run(
    store: RunStore,
    gate: GatePass,
    items: Sequence[PlannedItem],
    report: PlanReport,
    options: RunOptions,
    profile: Profile,
) -> str:
    check_budget(report, options)
    new = set(report.new_keys)
    params = {**options.params(), "provider_profile": profile.id}
    return store.create_run(
        gate.episode_pk,
        gate.command,
        params,
        [it for it in items if it.idempotency_key in new],
        report.reuse_keys,
    )


def prepare_resume(store: RunStore, run_id: str) -> None:
    run = store.get_run(run_id)
    if RunState(run.state) not in RESUMABLE_RUN_STATES:
        raise CommandNotAllowed(f"run {run_id} is {run.state}; only paused or failed runs resume")


# ---------------------------------------------------------------------------- execution
class ItemExecutor(Protocol):
    """Runs `work(item)` for every item, at most `concurrency` at a time."""

    def __call__(
        self,
        items: Sequence[Item],
        work: Callable[[Item], str],
        concurrency: int,
        stop: threading.Event,
        progress: Callable[[Item, str], None],
    ) -> None: ...


def thread_pool_executor(
    items: Sequence[Item],
    work: Callable[[Item], str],
    concurrency: int,
    stop: threading.Event,
    progress: Callable[[Item, str], None],
) -> None:
    """The CLI's executor. Ctrl-C stops new items; in-flight ones see `stop` and give up."""
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="item") as pool:
        pending: dict[Future[str], Item] = {}
        queue = list(items)
        try:
            while queue or pending:
                while queue and len(pending) < concurrency and not stop.is_set():
                    item = queue.pop(0)
                    pending[pool.submit(work, item)] = item
                if not pending:
                    break
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    progress(pending.pop(future), future.result())
        except BaseException:
            stop.set()
            for future in pending:
                future.cancel()
            wait(pending)
            raise


@dataclass
class RunEngine:
    store: RunStore
    gate: GatePass
    provider: Provider
    profile: Profile
    output_dir: Path
    executor: ItemExecutor = thread_pool_executor
    stop: threading.Event = field(default_factory=threading.Event)
    on_progress: Callable[[Item, str], None] = lambda item, result: None
    planned_keys: frozenset[str] = frozenset()

    def execute(self, run_id: str, options: RunOptions, skipped: int = 0) -> RunOutcome:
        runnable = self.runnable_items(run_id, options)
        self.store.transition_run(run_id, RunState.RUNNING)
        concurrency = max(1, min(options.concurrency, self.provider.capabilities.max_concurrency))
        try:
            self.executor(
                runnable,
                _ItemWork(self, run_id, options),
                concurrency,
                self.stop,
                self.on_progress,
            )
        except KeyboardInterrupt:
            self.stop.set()
        except Exception as exc:
            self.stop.set()
            self.store.fail_running_items(run_id, f"error: {_reason(exc)}")
            self.store.transition_run(run_id, RunState.FAILED, f"error: {_reason(exc)}")
            raise
        except BaseException:  # a termination signal (a cancelled flow run gets SIGTERM)
            self.stop.set()
            self._pause(run_id)
            raise
        if self.stop.is_set():
            self._pause(run_id)
            return self._outcome(run_id, RunState.PAUSED, ExitCode.INTERRUPTED, skipped)
        return self.finish(run_id, skipped)

    def _mark_generated(self, run_id: str) -> None:
        """The episode is generated once every image of its current plan is completed."""
        if not self.planned_keys:
            return
        index = self.store.snapshots(self.gate.episode_pk)
        done = all(
            (snap := index.get(key)) is not None and snap.state == ItemState.COMPLETED
            for key in self.planned_keys
        )
        review = ReviewStore(self.store.engine)
        if done and review.state(self.gate.episode_pk) in (
            EpisodeState.ALLOCATED,
            EpisodeState.REJECTED,
        ):
            review.transition(self.gate.episode_pk, EpisodeState.GENERATED, {"run_id": run_id})

    def _pause(self, run_id: str) -> None:
        self.store.fail_running_items(run_id, INTERRUPTED)
        self.store.transition_run(run_id, RunState.PAUSED, INTERRUPTED)

    def runnable_items(self, run_id: str, options: RunOptions) -> list[Item]:
        """The run's items that the planning rules still allow to run (resume obeys them too)."""
        candidates = self.store.run_items(
            run_id, [ItemState.PENDING, ItemState.FAILED, ItemState.RUNNING]
        )
        snapshots = self.store.snapshots(self.gate.episode_pk)
        kinds = {
            it.pk: classify(snapshots.get(it.idempotency_key), options, self.store)
            for it in candidates
        }
        paid = sum(1 for it in candidates if kinds[it.pk] in ("new", "retry"))
        if options.max_images is not None and paid > options.max_images:
            raise BudgetExceeded(
                f"run needs {paid} new paid calls, --max-images allows {options.max_images}; "
                "nothing was done"
            )
        return [it for it in candidates if kinds[it.pk] in RUNNABLE]

    def finish(self, run_id: str, skipped: int) -> RunOutcome:
        counts = self.store.counts(run_id)
        if counts.failed == 0 and counts.pending == 0 and counts.running == 0:
            self.store.transition_run(run_id, RunState.COMPLETED)
            self._mark_generated(run_id)
            return self._outcome(run_id, RunState.COMPLETED, ExitCode.OK, skipped)
        code = ExitCode.PARTIAL if counts.completed or skipped else ExitCode.RUN_FAILED
        self.store.transition_run(run_id, RunState.FAILED, f"{counts.failed} items failed")
        return self._outcome(run_id, RunState.FAILED, code, skipped)

    def _outcome(self, run_id: str, state: RunState, code: ExitCode, skipped: int) -> RunOutcome:
        counts = self.store.counts(run_id)
        resume = f"episodic runs resume {run_id}"
        message = {
            ExitCode.OK: f"run {run_id} completed",
            ExitCode.INTERRUPTED: f"run {run_id} interrupted and paused; resume with: {resume}",
            ExitCode.PARTIAL: f"run {run_id}: {counts.failed} items failed; resume with: {resume}",
            ExitCode.RUN_FAILED: f"run {run_id}: every item failed; resume with: {resume}",
        }[code]
        return RunOutcome(run_id, state, code, counts, skipped, message)

    # ------------------------------------------------------------------ one item
    def process(self, run_id: str, item: Item, options: RunOptions) -> str:
        """Take one item as far as it goes; returns what happened. Never pays twice."""
        if self.stop.is_set():
            return "not started"
        fresh = item.attempts == 0 and item.state == ItemState.PENDING
        if not fresh and item.state != ItemState.RUNNING:  # a stale one is taken over as is
            self.store.set_item_state(item.pk, ItemState.RUNNING)
        try:
            if fresh:  # never submitted, so no submission can be open: start and intend at once
                submission = self.store.begin_submission(
                    item, run_id, self.profile.id, forced=False, start_item=True
                )
                remote_ref = self._submit(submission.pk, submission.client_reference, item)
                if remote_ref is None:
                    return "unknown"
                return self._collect(item, submission.pk, remote_ref, options)
            return self._advance(run_id, item, options)
        except Stopped:
            self.store.set_item_state(item.pk, ItemState.FAILED, INTERRUPTED)
            return INTERRUPTED
        except ProviderError as exc:
            self.store.set_item_state(item.pk, ItemState.FAILED, _reason(exc))
            return "failed"
        except Exception as exc:  # a bug or an outage must not leave the item "running"
            self.store.set_item_state(item.pk, ItemState.FAILED, f"error: {_reason(exc)}")
            raise

    def _advance(self, run_id: str, item: Item, options: RunOptions) -> str:
        submission = self.store.open_submission(item.pk)
        remote_ref = None
        if submission is not None and submission.state == SubmissionState.ACCEPTED:
            remote_ref = submission.remote_ref
        elif submission is not None:  # intent or unknown: acceptance is not known
            remote_ref = self._reconcile(submission.pk, submission.client_reference)
            if remote_ref is None and not options.force_resubmit:
                self.store.close_submission(
                    submission.pk, SubmissionState.UNKNOWN, "acceptance unknown"
                )
                self.store.set_item_state(
                    item.pk,
                    ItemState.FAILED,
                    "submission outcome unknown: not resubmitted; after checking the provider, "
                    f"use: episodic runs resume {run_id} --force-resubmit",
                )
                return "unknown"
            if remote_ref is None:
                self.store.close_submission(
                    submission.pk,
                    SubmissionState.FAILED,
                    "abandoned by operator (--force-resubmit)",
                )
            else:
                submission = self.store.open_submission(item.pk)
        if remote_ref is None:
            if self.stop.is_set():
                raise Stopped()
            submission = self.store.begin_submission(
                item, run_id, self.profile.id, forced=options.force_resubmit
            )
            remote_ref = self._submit(submission.pk, submission.client_reference, item)
            if remote_ref is None:
                return "unknown"
        assert submission is not None
        return self._collect(item, submission.pk, remote_ref, options)

    def _reconcile(self, submission_pk: int, client_reference: str) -> str | None:
        if not self.provider.capabilities.can_lookup:
            return None
        remote_ref = self.provider.lookup(client_reference)
        if remote_ref is not None:
            self.store.accept_submission(submission_pk, remote_ref)
        return remote_ref

    def _submit(self, submission_pk: int, client_reference: str, item: Item) -> str | None:
        request = ImageRequest(
            client_reference, self.gate.episode_id, item.item_id, item.prompt, item.seed
        )
        try:
            remote_ref: str = _with_transient_retries(lambda: self.provider.submit(request))
        except UnknownOutcome as exc:
            self.store.close_submission(submission_pk, SubmissionState.UNKNOWN, _reason(exc))
            self.store.set_item_state(
                item.pk, ItemState.FAILED, f"acceptance unknown ({_reason(exc)}); not resubmitted"
            )
            return None
        except ProviderError as exc:
            self.store.close_submission(submission_pk, SubmissionState.FAILED, _reason(exc))
            raise
        self.store.accept_submission(submission_pk, remote_ref)
        return remote_ref

    def _collect(self, item: Item, submission_pk: int, remote_ref: str, options: RunOptions) -> str:
        try:
            result = _with_transient_retries(
                lambda: self.provider.collect(
                    remote_ref, deadline_s=options.collect_timeout_s, should_stop=self.stop.is_set
                )
            )
        except PermanentProviderError as exc:
            self.store.close_submission(submission_pk, SubmissionState.FAILED, _reason(exc))
            raise
        path = self.output_dir / f"{item.item_id}.png"
        sha256 = write_atomically(path, result.content)
        self.store.complete_item(
            item.pk,
            submission_pk,
            self.gate.episode_pk,
            str(path),
            sha256,
            result.cost_minor,
            self.provider.capabilities.currency,
        )
        return "completed"


@dataclass(frozen=True)
class _ItemWork:
    """`work(item)` for an executor; carries the run id for executors that need it."""

    engine: RunEngine
    run_id: str
    options: RunOptions

    def __call__(self, item: Item) -> str:
        return self.engine.process(self.run_id, item, self.options)


def _with_transient_retries(call: Callable[[], Any]) -> Any:
    retrying = Retrying(
        retry=retry_if_exception_type(TransientProviderError),
        stop=stop_after_attempt(4),
        wait=wait_exponential_jitter(multiplier=0.05, max=2.0),
        reraise=True,
    )
    return retrying(call)


def _reason(exc: BaseException) -> str:
    return (str(exc) or type(exc).__name__)[:500]


def write_atomically(path: Path, content: bytes) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_bytes(content)
    os.replace(tmp, path)
    return hashlib.sha256(content).hexdigest()
