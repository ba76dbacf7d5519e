"""The run engine (DESIGN 5): execute a run's items under claims, then finish it. No Prefect.

The CLI and the Prefect flow share it; they differ only in the `ItemExecutor` that runs the
per-item work (a thread pool here, cached Prefect tasks in `tasks.generate`).

How a run spends money exactly once:

- **Claims.** Before any paid call the executor *claims* the item (`storage.claims`): one
  transaction checks the run is running, takes the item with a lease and commits the intent
  of the paid call. Several runs, processes or Prefect workers on one episode split its
  items; an item held by another live claim is *followed* (this run waits for it and reports
  it completed when its holder finishes), never bought twice.
- **Leases and heartbeats.** A background heartbeat renews this process's leases every
  third of the lease and watches the run's state: a cancel or a pause from anywhere stops
  this process at the next item. A killed holder's lease expires and another run takes over;
  the intent it left behind is reconciled, never resubmitted.
- **Errors by what they prove** (`providers.base`): refused → the item fails (a retry is a
  new attempt); unknown → the submission is reconciled (lookup by our client reference, or
  the same create again when the provider honours idempotent creates), never a new paid
  call; accepted → collected, across runs, until the provider says the job failed.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import suppress
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from sqlalchemy.exc import DBAPIError
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential_jitter

from core.errors import BudgetExceeded, CommandNotAllowed, InvalidTransition
from core.exit_codes import ExitCode
from core.hints import hint
from core.runs import INTERRUPTED, REPLANNED, Claim, Item, Refusal, Submission
from core.states import ItemState, RunState
from pipeline.gate import GatePass
from pipeline.runs import RunOptions, RunOutcome, classify, write_atomically
from providers.base import (
    CollectionPending,
    DescribesJobs,
    ImageRequest,
    NotCreated,
    Provider,
    ProviderError,
    RemoteJobFailed,
    Stopped,
    TransientProviderError,
    UnknownOutcome,
)
from providers.profiles import Profile
from storage.base import utcnow
from storage.cancels import CancelStore
from storage.claims import ClaimStore
from storage.episodes import EpisodeRepository
from storage.leases import LeaseStore
from storage.ledger import LedgerStore
from storage.plans import PlanStore
from storage.runs import RunStore
from storage.tx import lost_connection

FOLLOWABLE = frozenset({"new", "collect", "reconcile", "retry", "busy"})


def new_owner() -> str:
    """A claim owner: host, process and a random part (readable in `runs show`)."""
    return f"{socket.gethostname()[:24]}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


class ItemJob(Protocol):
    """What an executor drives: claim an item (None: not ours to do now), then run it.

    After a None, `throttled` says whether the item was refused only because the provider's
    limit of items in flight is reached: the executor keeps it and asks again once a slot
    may have freed, instead of moving on.
    """

    run_id: str
    owner: str
    engine: RunEngine  # the run's engine: an item task in the same process may share it

    @property
    def throttled(self) -> bool: ...

    @property
    def profile_id(self) -> str: ...

    def claim(self, item: Item) -> Claim | None: ...

    def claim_many(self, items: Sequence[Item]) -> list[Claim | None]: ...

    def was_throttled(self, item: Item) -> bool: ...

    def take(self, item_pk: int) -> Claim: ...

    def run(self, claim: Claim) -> str: ...

    def abandon(self, claim: Claim, reason: str = ...) -> None: ...

    def release(self, claim: Claim) -> None: ...

    def collectible(self) -> list[Item]:
        """The run's items whose accepted jobs (or unanswered intents) hold provider slots
        and that no live claim holds: a throttled executor claims these before it waits."""

    def waiting(self, for_slot: bool) -> None:
        """The executor waits for a provider slot (True) or goes on working (False)."""


class ItemExecutor(Protocol):
    """Claims and runs items, at most `concurrency` at a time; stops dispatching on `stop`."""

    def __call__(
        self,
        items: Sequence[Item],
        job: ItemJob,
        concurrency: int,
        stop: threading.Event,
        progress: Callable[[Item, str], None],
    ) -> None: ...


THROTTLE_POLL_S = 0.25  # how often a throttled executor asks again for a provider slot
# `RunEngine.process`: the item's job was accepted but not ready within the collect timeout.
# Its open submission keeps a provider slot (`ClaimStore.claim`), so a throttled executor
# collects such items again (`collect_first`) before it waits for a slot.
COLLECT_LATER = "collect later"
# A claim proved (ours, live, run running) by its own transaction less than this long ago
# needs no second check before its paid call (`RunEngine._holds`).
CLAIM_PROOF_FRESH_S = 0.25


def claim_next(
    queue: deque[Item], job: ItemJob, stop: threading.Event, room: int
) -> tuple[list[tuple[Item, Claim]], bool]:
    """Claim up to `room` items from the front of `queue` in one transaction (the
    dispatching executors' rule: one write fills every free slot).

    Returns the claims and whether the provider's limit stopped it: the throttled items go
    back to the front of the queue, in order, so they are asked for again first.
    """
    if stop.is_set() or room <= 0 or not queue:
        return [], False
    batch = [queue.popleft() for _ in range(min(room, len(queue)))]
    answers = job.claim_many(batch)
    claimed = [(item, claim) for item, claim in zip(batch, answers, strict=True) if claim]
    if not job.throttled:
        return claimed, False
    held = {item.pk for item, _ in claimed}
    back = [item for item, claim in zip(batch, answers, strict=True) if claim is None]
    throttled = [item for item in back if item.pk not in held and job.was_throttled(item)]
    queue.extendleft(reversed(throttled))
    return claimed, True


def collect_first(queue: deque[Item], job: ItemJob, working: set[int]) -> bool:
    """A throttled dispatcher's first step: put the run's collectible items (`ItemJob.
    collectible`: accepted jobs nobody collects, left by a killed or interrupted process of
    the run, taken over from an expired claim, or left for later by this one) at the front of
    `queue`, except those in `working` (this dispatcher's items in flight). Their jobs hold
    the very slots the throttle counts, and collecting one needs no slot, so a recovering run
    collects them before it waits (after `kill -9` it waited for `max_job_s` behind them).
    Returns whether any was found (the caller claims them at once)."""
    found = [item for item in job.collectible() if item.pk not in working]
    if not found:
        return False
    first = {item.pk for item in found}
    rest = [item for item in queue if item.pk not in first]
    queue.clear()
    queue.extend(found + rest)
    return True


_THROTTLED = "\x00throttled"  # a worker's answer for an item refused for a provider slot


def thread_pool_executor(
    items: Sequence[Item],
    job: ItemJob,
    concurrency: int,
    stop: threading.Event,
    progress: Callable[[Item, str], None],
) -> None:
    """The CLI's executor: each of `concurrency` workers claims its item and runs it, so
    claims (a short write transaction each) overlap with other items' provider calls."""

    def claim_and_run(item: Item) -> str | None:
        if stop.is_set():
            return None
        claim = job.claim(item)
        if claim is None:
            return _THROTTLED if job.throttled else None
        return job.run(claim)

    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="item") as pool:
        pending: dict[Future[str | None], Item] = {}
        queue = deque(items)
        throttled = False
        try:
            while queue or pending:
                if throttled and collect_first(queue, job, {it.pk for it in pending.values()}):
                    throttled = False  # our slots are held by jobs we can collect: do it
                elif throttled and not pending:
                    job.waiting(True)
                    if stop.wait(THROTTLE_POLL_S):
                        break  # throttled with nothing of ours running: probe every 0.25 s
                while queue and len(pending) < concurrency and not stop.is_set():
                    if throttled and pending:
                        break  # a slot frees when one of ours finishes: ask again then
                    item = queue.popleft()
                    pending[pool.submit(claim_and_run, item)] = item
                    if throttled:
                        break
                if not pending:
                    if stop.is_set() or not queue:
                        break
                    stop.wait(THROTTLE_POLL_S)  # every slot is another run's: wait for one
                    continue
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                throttled = False
                for future in done:
                    item = pending.pop(future)
                    result = future.result()
                    if result == _THROTTLED:
                        queue.appendleft(item)
                        throttled = True
                    elif result is not None:
                        job.waiting(False)
                        progress(item, result)
        except BaseException:
            stop.set()
            for future in pending:
                future.cancel()
            wait(pending)
            raise


class _Heartbeat(threading.Thread):
    """Renews the owner's leases and stops the run's work when the run stops running."""

    def __init__(
        self, engine: RunEngine, owner: str, run_id: str, lease_s: float, stop: threading.Event
    ) -> None:
        super().__init__(name=f"heartbeat-{run_id[:8]}", daemon=True)
        self.engine, self.owner, self.run_id, self.lease_s = engine, owner, run_id, lease_s
        self.stop_work = stop
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(max(0.2, self.lease_s / 3)):
            try:
                state = self.engine.leases.renew(self.owner, self.run_id, self.lease_s)
                # Concluded elsewhere, or paused by another process's interrupt, while this
                # process still works on it: the run goes on here (only a cancel stops every
                # process). A process that is stopping itself leaves the run as it is.
                if state in _REOPENED and not self.stop_work.is_set():
                    state = self.engine.reopen(self.run_id, self.lease_s)
            except Exception:  # a database hiccup: try again; guarded writes stay safe
                continue
            if state != RunState.RUNNING:  # paused, cancelled or completed: stop here
                self.stop_work.set()


_REOPENED = (RunState.FAILED, RunState.PAUSED)


@dataclass
class _Job:
    """One process's share of one run: its claims, and the items it found held elsewhere."""

    engine: RunEngine
    run_id: str
    owner: str
    options: RunOptions
    no_retry: set[int] = field(default_factory=set)  # items followed after another holder
    taken_back: set[int] = field(default_factory=set)  # items given up unfinished, taken back
    _local: threading.local = field(default_factory=threading.local)
    busy: dict[int, str] = field(default_factory=dict)
    followed: set[str] = field(default_factory=set)
    claims: dict[int, Claim] = field(default_factory=dict)
    guard: threading.Lock = field(default_factory=threading.Lock)
    _waiting_for_slot: bool = False

    @property
    def profile_id(self) -> str:
        return self.engine.profile.id

    @property
    def throttled(self) -> bool:
        """This thread's last claim was refused for a provider slot only."""
        return bool(getattr(self._local, "throttled", False))

    def claim_many(self, items: Sequence[Item]) -> list[Claim | None]:
        """`claim` for several items in one transaction; refused ones are handled as in
        `claim` (throttled ones are remembered for `was_throttled`)."""
        engine = self.engine
        since = utcnow()
        try:
            answers = engine.claims.claim_many(
                [(item.pk, item.pk not in self.no_retry) for item in items],
                self.run_id,
                self.owner,
                lease_s=self.options.lease_s,
                max_attempts=self.options.max_attempts,
                profile=engine.profile.id,
                provider_limit=engine.profile.max_concurrency,
                max_job_s=engine.profile.max_job_s,
            )
        except DBAPIError as exc:
            if not lost_connection(exc):
                raise
            # Its COMMIT may have happened, but nothing it made was received, so nothing was
            # sent: give it all back (the store retries that through the outage), and the
            # items are asked for again after a short wait, as throttled ones are. The run
            # goes on instead of ending on a claim whose outcome is now known.
            engine.leases.give_back_unreceived(self.owner, [it.pk for it in items], since)
            self._local.throttled_pks = {item.pk for item in items}
            self._local.throttled = True
            return [None for _ in items]
        self._local.throttled_pks = set()
        out: list[Claim | None] = []
        reopen = False
        for item, got in zip(items, answers, strict=True):
            if isinstance(got, Claim):
                with self.guard:
                    self.claims[item.pk] = got
                    self.busy.pop(item.pk, None)  # found held before, now ours (collected)
                out.append(got)
                continue
            if got.reason in ("throttled", "reopen"):  # asked again after a short wait
                self._local.throttled_pks.add(item.pk)
                reopen = reopen or got.reason == "reopen"
            else:
                self._refused(item, got)
            out.append(None)
        self._local.throttled = bool(self._local.throttled_pks)
        if reopen and not engine.stop.is_set():  # this process still has work (and is not
            engine.reopen(self.run_id, self.options.lease_s)  # stopping): the run goes on
        return out

    def was_throttled(self, item: Item) -> bool:
        """The last `claim_many` of this thread refused `item` for a provider slot."""
        return item.pk in getattr(self._local, "throttled_pks", set())

    def claim(self, item: Item) -> Claim | None:
        """Claim one item (`claim_many` of one): None when refused, `throttled` says why."""
        (got,) = self.claim_many([item])
        return got

    def _refused(self, item: Item, refusal: Refusal) -> None:
        if refusal.reason == "busy":
            self.busy[item.pk] = refusal.holder_run or "?"
            if refusal.holder_run and refusal.holder_run != self.run_id:
                self.followed.add(refusal.holder_run)
        elif refusal.reason == "stopped":
            self.engine.stop.set()
        elif refusal.reason == "throttled":
            pass  # the executor keeps the item and asks again
        else:  # done, exhausted, failed: nothing for this process to do
            self.engine.on_progress(item, "completed" if refusal.reason == "done" else "skipped")

    def take(self, item_pk: int) -> Claim:
        """The claim made for `item_pk` (executors that run items elsewhere look it up)."""
        with self.guard:
            return self.claims.pop(item_pk)

    def run(self, claim: Claim) -> str:
        with self.guard:
            self.claims.pop(claim.item.pk, None)
        return self.engine.process(claim, self.options)

    def abandon(self, claim: Claim, reason: str = INTERRUPTED) -> None:
        """Give up a claim whose work never started: the intent was never sent."""
        with self.guard:
            self.claims.pop(claim.item.pk, None)
        self.engine.withdraw_unsent(claim)
        self.engine.leases.release(claim, reason)

    def release(self, claim: Claim) -> None:
        """Free a claim whose worker ended without finishing (a lost Dask worker, a crashed
        task): the item becomes failed and resumable. A task that never loaded its claim
        sent nothing, and its intent is withdrawn; an intent it may have sent stays open
        and is reconciled by the next claim, never resubmitted (`release_unstarted`)."""
        self.engine.leases.release_unstarted(claim, INTERRUPTED)

    def collectible(self) -> list[Item]:
        """The run's items whose jobs hold provider slots and that it may collect now
        (`RunStore.collectible`)."""
        return self.engine.store.collectible(self.run_id, self.profile_id)

    def waiting(self, for_slot: bool) -> None:
        """Tell the engine's `on_wait` once each time this job starts or stops waiting for a
        provider slot (a run whose every slot is taken elsewhere shows why it stands still)."""
        if for_slot == self._waiting_for_slot:
            return
        self._waiting_for_slot = for_slot
        self.engine.on_wait(
            f"waiting for a provider slot (profile {self.profile_id}: every slot in use)"
            if for_slot
            else None
        )

    def abandon_untaken(self) -> None:
        """Claims made but never run (a cancelled future, a task that never started)."""
        with self.guard:
            left = list(self.claims.values())
        for claim in left:
            self.abandon(claim)


@dataclass
class RunEngine:
    store: RunStore
    claims: ClaimStore
    leases: LeaseStore
    ledger: LedgerStore
    plans: PlanStore
    cancels: CancelStore
    episodes: EpisodeRepository
    gate: GatePass
    provider: Provider
    profile: Profile
    output_dir: Path
    executor: ItemExecutor = thread_pool_executor
    stop: threading.Event = field(default_factory=threading.Event)
    # Set with `stop` by this process's own interrupt (Ctrl-C, SIGTERM) when the caller can
    # tell it apart from a stop from elsewhere: the run is paused, as when the interrupt is
    # raised here as KeyboardInterrupt (which a library may swallow on its way).
    interrupted: threading.Event = field(default_factory=threading.Event)
    on_progress: Callable[[Item, str], None] = lambda item, result: None
    # Called with a line when the run starts waiting for a provider slot, None when it goes on.
    on_wait: Callable[[str | None], None] = lambda text: None
    planned_keys: frozenset[str] = frozenset()
    plan_id: int | None = None  # the recorded plan `planned_keys` come from
    reference_image: str | None = None  # the plan's reference image, a data: URI
    follow_poll_s: float = 0.5

    # ------------------------------------------------------------------ the run
    def execute(
        self, run_id: str, options: RunOptions, skipped: int = 0, *, deduplicated: bool = False
    ) -> RunOutcome:
        """Run (or join) `run_id` until its items are done, failed, or it is stopped.

        `deduplicated` only labels the outcome (the caller's request joined an existing run).
        """
        items = self.runnable_items(run_id, options)
        job = _Job(self, run_id, new_owner(), options)
        ended = self._start(run_id, job.owner, options.lease_s)
        if ended is not None:  # the run we joined finished meanwhile: its outcome is ours
            return replace(self._outcome(run_id, ended, skipped, ()), deduplicated=deduplicated)
        heartbeat = _Heartbeat(self, job.owner, run_id, options.lease_s, self.stop)
        heartbeat.start()
        interrupted = False
        concurrency = max(1, min(options.concurrency, self.provider.capabilities.max_concurrency))
        try:
            while items:
                job.busy.clear()
                self.executor(items, job, concurrency, self.stop, self.on_progress)
                if self.stop.is_set():
                    break
                if not job.busy:
                    # Items another process claimed after this one listed them: the run is
                    # not over while they run, so they are followed (and taken over if their
                    # holder dies): this process never concludes the run under another's feet.
                    items = self.store.held_elsewhere(run_id, job.owner)
                    if not items:  # what a process of this run (this one too) gave up
                        items = [  # unfinished: this one finishes it, once each
                            it
                            for it in self.store.unfinished(run_id)
                            if it.pk not in job.taken_back
                        ]
                        if not items:
                            break
                        job.taken_back.update(it.pk for it in items)
                        job.no_retry.difference_update(job.taken_back)
                        continue
                    self.stop.wait(self.follow_poll_s)
                    continue
                # Follow items held by other live claims: finished, taken over, or given up.
                job.no_retry.update(job.busy)
                waiting = set(job.busy)
                items = [it for it in items if it.pk in waiting]
                self.stop.wait(self.follow_poll_s)
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM of this process: it pauses the run
            interrupted = True
            self.stop.set()
        except Exception as exc:
            self.stop.set()
            self.leases.release_all(job.owner, f"error: {_reason(exc)}")
            self._move(run_id, RunState.FAILED, f"error: {_reason(exc)}")
            raise
        except BaseException:  # a termination signal (a cancelled flow run gets SIGTERM)
            self.stop.set()
            self._pause(run_id, job.owner)
            raise
        finally:
            job.abandon_untaken()
            heartbeat.done.set()
        followed = tuple(sorted(job.followed))
        if self.stop.is_set():
            interrupted = interrupted or self.interrupted.is_set()
            outcome = self._stopped(run_id, job.owner, skipped, followed, interrupted)
        else:
            outcome = self.finish(run_id, skipped, followed)
        return replace(outcome, deduplicated=deduplicated)

    def runnable_items(self, run_id: str, options: RunOptions) -> list[Item]:
        """The run's items the planning rules still allow (a resume obeys them too)."""
        candidates = self.store.run_items(
            run_id, [ItemState.PENDING, ItemState.FAILED, ItemState.RUNNING, ItemState.CANCELLED]
        )
        snapshots = self.plans.snapshots(self.gate.episode_pk)
        now = utcnow()
        kinds = {
            it.pk: classify(snapshots.get(it.idempotency_key), options, now) for it in candidates
        }
        paid = sum(1 for it in candidates if kinds[it.pk] in ("new", "retry"))
        if options.max_images is not None and paid > options.max_images:
            raise BudgetExceeded(
                f"run needs {paid} new paid calls, --max-images allows {options.max_images}; "
                "nothing was done"
            )
        return [it for it in candidates if kinds[it.pk] in FOLLOWABLE]

    def finish(self, run_id: str, skipped: int, followed: tuple[str, ...] = ()) -> RunOutcome:
        """Conclude the run from its items as they stand. A run another process concluded
        as failed, or paused by its interrupt, while this one finished the rest is concluded
        here (failed or paused → running → completed or failed: the last process to finish
        decides)."""
        counts = self.store.counts(run_id)
        done = counts.failed == 0 and counts.pending == 0 and counts.running == 0
        if done:
            # Marked while the run is still live: `check` never sees an episode whose images
            # are all completed, no run working on it, and not yet marked (a crash's sign).
            self.mark_generated(run_id)
        current = self.store.run_state(run_id)
        if current == RunState.PAUSED or (done and current == RunState.FAILED):
            self._move(run_id, RunState.RUNNING)
        if done:
            state = self._move(run_id, RunState.COMPLETED)
        else:
            state = self._move(run_id, RunState.FAILED, f"{counts.failed} items failed")
        return self._outcome(run_id, state, skipped, followed)

    def reopen(self, run_id: str, lease_s: float) -> RunState:
        """Move a failed run back to running for this process, which still has work on it
        (another process concluded it, or the sweep reaped it while this one was frozen);
        returns the state it is in now. Claims stay guarded: nothing is paid twice."""
        with suppress(InvalidTransition):
            self.store.transition_run(run_id, RunState.RUNNING, lease_s=lease_s)
        return RunState(self.store.run_state(run_id))

    def _start(self, run_id: str, owner: str, lease_s: float) -> RunState | None:
        """Start the run, or join it and renew its lease at once (a run whose process died
        is taken over before a sweep can reap it; one the sweep just reaped is restarted).

        Returns None when this process may work on the run, or the terminal state
        (completed, cancelled) it reached before this process could join it.
        """
        for _ in range(3):
            try:
                if self.store.transition_run(run_id, RunState.RUNNING, lease_s=lease_s):
                    return None
            except InvalidTransition as exc:
                state = RunState(self.store.run_state(run_id))
                if state in (RunState.COMPLETED, RunState.CANCELLED):
                    return state
                raise CommandNotAllowed(str(exc)) from None
            if self.leases.renew(owner, run_id, lease_s) == RunState.RUNNING:
                return None
        raise CommandNotAllowed(f"run {run_id} keeps changing state; try again")

    def _move(self, run_id: str, target: RunState, error_text: str | None = None) -> RunState:
        """Move the run if it still can; the state it ends in (a concurrent move may win)."""
        with suppress(InvalidTransition):
            self.store.transition_run(run_id, target, error_text)
        return RunState(self.store.run_state(run_id))

    def _pause(self, run_id: str, owner: str) -> None:
        self.leases.release_all(owner, INTERRUPTED)
        self._move(run_id, RunState.PAUSED, INTERRUPTED)

    def _stopped(
        self,
        run_id: str,
        owner: str,
        skipped: int,
        followed: tuple[str, ...],
        interrupted: bool = True,
    ) -> RunOutcome:
        """Stopped by an interrupt of this process (it pauses the run), or by a cancel,
        pause or finish of the run from elsewhere (the run is left as it is: a run another
        process resumed meanwhile goes on there)."""
        self.leases.release_all(owner, INTERRUPTED)
        state = RunState(self.store.run_state(run_id))
        if state == RunState.RUNNING and interrupted:
            state = self._move(run_id, RunState.PAUSED, INTERRUPTED)
        return self._outcome(run_id, state, skipped, followed)

    def mark_generated(self, run_id: str | None) -> None:
        """The episode is generated once every image of its current plan is completed."""
        mark_generated(self.episodes, self.gate.episode_pk, self.planned_keys, run_id, self.plan_id)

    def _outcome(
        self, run_id: str, state: RunState, skipped: int, followed: tuple[str, ...]
    ) -> RunOutcome:
        counts = self.store.counts(run_id)
        resume = hint(
            f"episodic runs resume {run_id}",
            f"run the generate deployment again for {self.gate.episode_id} (it resumes run "
            f"{run_id} and pays nothing twice)",
        )
        if state == RunState.COMPLETED:
            self.mark_generated(run_id)
            code, message = ExitCode.OK, f"run {run_id} completed"
            if followed:
                message += f" (followed items in progress by run {', '.join(followed)})"
        elif state == RunState.FAILED:
            code = ExitCode.PARTIAL if counts.completed or skipped else ExitCode.RUN_FAILED
            what = (
                f"{counts.failed} items failed" if code == ExitCode.PARTIAL else "every item failed"
            )
            message = f"run {run_id}: {what}; resume with: {resume}"
        elif state == RunState.CANCELLED:
            code = ExitCode.INTERRUPTED
            message = f"run {run_id} was cancelled; it stopped before its next paid call"
            if self.store.get_run(run_id).error_text == REPLANNED:
                message = (
                    f"run {run_id} was cancelled: episode {self.gate.episode_id} was re-planned "
                    "while it worked, and it stopped before paying for anything the new plan "
                    "does not ask for; "
                    + hint(
                        f"`episodic generate {self.gate.episode_id}` generates the new plan",
                        f"run the generate deployment again for {self.gate.episode_id}",
                    )
                )
        elif state == RunState.RUNNING:  # paused and resumed elsewhere while this one stopped
            code = ExitCode.INTERRUPTED
            message = (
                f"run {run_id} stopped here and goes on in another process; follow it with: "
                f"episodic runs show {run_id}"
            )
        else:
            code = ExitCode.INTERRUPTED
            message = f"run {run_id} interrupted and paused; resume with: {resume}"
        return RunOutcome(run_id, state, code, counts, skipped, message, followed)

    # ------------------------------------------------------------------ one item
    def process(self, claim: Claim, options: RunOptions) -> str:
        """Take one claimed item as far as it goes; returns what happened. Never pays twice."""
        if self.stop.is_set():
            self.withdraw_unsent(claim)
            self.leases.release(claim, INTERRUPTED)
            return INTERRUPTED
        try:
            if claim.action == "submit":
                assert claim.submission is not None
                found = self._send(claim, claim.submission)
            elif claim.action == "collect":
                assert claim.submission is not None and claim.submission.remote_ref
                found = (claim.submission.pk, claim.submission.remote_ref)
            else:
                found = self._reconcile(claim, options)
            if found is None:
                return "unknown"
            try:
                return self._collect(claim, found[0], found[1], options)
            except RemoteJobFailed as exc:
                if not self._buy_again(claim, found[0], exc, options):
                    raise
            # The job was cancelled on an operator's command, by the cancel of another run
            # that decided before this run included the item (`CancelStore.ask_provider_cancel`;
            # its cost is recorded): this run buys the item anew instead of failing it.
            fresh = self.leases.new_attempt(claim, self.profile.id, forced=False)
            if fresh is None:  # the run stopped or the claim was lost: spend nothing
                raise Stopped()
            found = self._send(claim, fresh)
            if found is None:
                return "unknown"
            return self._collect(claim, found[0], found[1], options)
        except Stopped:
            self.leases.release(claim, INTERRUPTED)
            return INTERRUPTED
        except CollectionPending as exc:
            self.leases.release(
                claim,
                f"accepted job not collected yet ({_reason(exc)}); a resume collects it at no cost",
            )
            return COLLECT_LATER
        except RemoteJobFailed as exc:
            self.leases.release(claim, f"remote job failed: {_reason(exc)}")
            return "failed"
        except NotCreated as exc:
            self.leases.release(claim, _reason(exc))
            return "failed"
        except Exception as exc:  # a bug or an outage must not leave the item "running"
            self.leases.release(claim, f"error: {_reason(exc)}")
            raise

    def _buy_again(
        self, claim: Claim, submission_pk: int, exc: RemoteJobFailed, options: RunOptions
    ) -> bool:
        """Whether the item whose job `exc` ended is bought anew in this run: only when the
        provider says the job was cancelled, the cancel of another run asked for exactly
        that (`CancelStore.cancel_asked_elsewhere`: decided before this run included the item),
        the item has an attempt left (--max-retries) and the run's budget holds one more
        call with every open item of the run still to buy (--max-images, --max-cost, else
        EPISODIC_MAX_RUN_COST). Otherwise the item fails, and the operator decides."""
        if not exc.cancelled:  # failed at the provider, or cancelled by this run's own cancel
            return False
        if not self.cancels.cancel_asked_elsewhere(
            self.gate.episode_pk, submission_pk, claim.run_id
        ):
            return False
        used = claim.item.attempts + (1 if claim.action == "submit" else 0)
        if used >= options.max_attempts:
            return False
        counts = self.store.counts(claim.run_id)
        still_open = counts.pending + counts.running  # this item among them
        price = self.provider.capabilities.cost_per_image_minor
        cost = counts.cost_minor + price * still_open
        if options.max_images is None and options.max_cost_minor is None:
            return options.cap_minor is None or cost <= options.cap_minor
        images_fit = (
            options.max_images is None or counts.paid_submissions + still_open <= options.max_images
        )
        return images_fit and (options.max_cost_minor is None or cost <= options.max_cost_minor)

    def withdraw_unsent(self, claim: Claim) -> None:
        """A claim's fresh intent whose call was never made goes away (attempt given back)."""
        if claim.action == "submit" and claim.submission is not None:
            self.ledger.withdraw(claim, claim.submission)

    def _request(self, claim: Claim, submission: Submission) -> ImageRequest:
        item = claim.item
        return ImageRequest(
            submission.client_reference,
            self.gate.episode_id,
            item.item_id,
            item.prompt,
            item.seed,
            self.reference_image,
        )

    def _send(self, claim: Claim, submission: Submission) -> tuple[int, str] | None:
        """The paid call of an intent. None: acceptance unknown (item released, explained)."""
        request = self._request(claim, submission)
        if not self._holds(claim):  # cancelled, paused or taken over: no call
            self.ledger.withdraw(claim, submission)
            raise Stopped()
        try:
            remote_ref: str = self._retry_not_created(claim, lambda: self.provider.submit(request))
        except Stopped:  # between tries that provably created nothing: nothing was sent
            self.ledger.withdraw(claim, submission)
            raise
        except UnknownOutcome as exc:
            self.ledger.mark_unknown(submission.pk, _reason(exc))
            found = self._resolve(claim, submission, request)
            if found is None:
                self.leases.release(claim, self._unknown_text(claim, submission, _reason(exc)))
                return None
            return submission.pk, found
        except NotCreated as exc:
            self.ledger.refuse(claim, submission.pk, _reason(exc))
            raise
        if not self.ledger.accept(submission.pk, remote_ref):
            self.ledger.mark_unknown(submission.pk, "provider answered with a job already recorded")
            self.leases.release(
                claim, "provider answered with a job recorded for another submission"
            )
            return None
        return submission.pk, remote_ref

    def _reconcile(self, claim: Claim, options: RunOptions) -> tuple[int, str] | None:
        """An intent or unknown from before: ask the provider; resubmit only when forced."""
        submission = claim.submission
        assert submission is not None
        found = self._resolve(claim, submission, self._request(claim, submission))
        if found is not None:
            return submission.pk, found
        if not options.force_resubmit:
            self.ledger.mark_unknown(submission.pk, "acceptance unknown")
            self.leases.release(claim, self._unknown_text(claim, submission, "no reply recorded"))
            return None
        if not self.ledger.refuse(claim, submission.pk, "abandoned by operator (--force-resubmit)"):
            raise Stopped()  # taken over (or settled meanwhile): the new holder decides
        fresh = self.leases.new_attempt(claim, self.profile.id, forced=True)
        if fresh is None:  # the run stopped or the claim was lost: spend nothing
            raise Stopped()
        return self._send(claim, fresh)

    def _resolve(self, claim: Claim, submission: Submission, request: ImageRequest) -> str | None:
        """Settle an unknown without a new paid call, as far as the provider's promises go.

        An idempotent resend may still be the call that makes the one job (the first create
        never reached the provider), so it is a paid call: the claim is checked first."""
        caps = self.provider.capabilities
        if not (caps.can_lookup or caps.idempotent_create):
            return None
        for delay in (0.0, 0.2, 0.5, 1.0):
            if self.stop.wait(delay):
                return None
            try:
                remote_ref = None
                if caps.can_lookup:
                    remote_ref = self.provider.lookup(submission.client_reference, request)
                if remote_ref is None and caps.idempotent_create:
                    # the same create, same key: the provider returns the job it made, or
                    # makes the one job this submission stands for
                    if not self.leases.still_holds(claim):
                        return None  # cancelled or taken over: it stays unknown, unsent
                    remote_ref = self.provider.submit(request)
            except (UnknownOutcome, TransientProviderError):
                continue
            except ProviderError:  # refused or failed: it will not settle this way
                return None
            if remote_ref is not None and self.ledger.accept(submission.pk, remote_ref):
                return remote_ref
            if remote_ref is not None:  # another submission's job: never ours
                return None
        return None

    def _unknown_text(self, claim: Claim, submission: Submission, reason: str) -> str:
        caps = self.provider.capabilities
        run = claim.run_id
        if caps.can_lookup or caps.idempotent_create:
            again = hint(
                f"`episodic runs resume {run}`",
                f"running the generate deployment again for {self.gate.episode_id}",
            )
            return (
                f"acceptance unknown ({reason}); not resubmitted: {again} asks the provider "
                "again; only after checking the provider yourself: `episodic runs resume "
                f"{run} --force-resubmit`"
            )
        where = (  # a provider whose jobs carry no reference of ours says where to look
            self.provider.how_to_find(self._request(claim, submission))
            if isinstance(self.provider, DescribesJobs)
            else f"client reference {submission.client_reference}"
        )
        return (
            f"acceptance unknown ({reason}); provider profile {self.profile.id!r} can neither "
            f"look jobs up nor dedupe creates: look for {where} at the provider, then "
            f"`episodic runs resume {run} --force-resubmit` if it is not there"
        )

    def _collect(
        self, claim: Claim, submission_pk: int, remote_ref: str, options: RunOptions
    ) -> str:
        try:
            result = self.provider.collect(
                remote_ref, deadline_s=options.collect_timeout_s, should_stop=self.stop.is_set
            )
        except RemoteJobFailed as exc:
            self.ledger.close_failed(
                submission_pk,
                f"remote job failed: {_reason(exc)}",
                episode_pk=self.gate.episode_pk,
                cost_minor=exc.cost_minor,
                currency=self.provider.capabilities.currency,
            )
            raise
        # Content-addressed by the item key: another plan's image of the same video and part
        # has another key, so a file a reviewer saw or a ledger row points at is never
        # overwritten (going back to an earlier plan finds its images where they were).
        path = self.output_dir / f"{claim.item.item_id}.{claim.item.idempotency_key}.png"
        sha256 = write_atomically(path, result.content)
        completed = self.ledger.complete(
            claim,
            submission_pk,
            self.gate.episode_pk,
            str(path),
            sha256,
            result.cost_minor,
            self.provider.capabilities.currency,
        )
        return "completed" if completed else "taken over"

    def _holds(self, claim: Claim) -> bool:
        """The check right before a paid call: the claim is ours, live, and its run running.

        The transaction that made or loaded the claim proved exactly that; when it did so
        less than `CLAIM_PROOF_FRESH_S` ago (the usual case: the call follows the claim at
        once), that proof is the check and no other transaction is spent on it. A cancel
        that lands after the proof is seen before the next paid call, as with any check."""
        verified = claim.verified_at
        if verified is not None and time.monotonic() - verified < CLAIM_PROOF_FRESH_S:
            return True
        return self.leases.still_holds(claim)

    def _retry_not_created(self, claim: Claim, call: Callable[[], str]) -> str:
        """Send again only what provably created nothing (never sent, 429), with backoff;
        every try after a backoff checks the claim again first (a cancel or a lost lease
        during the wait stops it: `Stopped`)."""
        tries = 0

        def attempt() -> str:
            nonlocal tries
            tries += 1
            if self.stop.is_set() or (tries > 1 and not self.leases.still_holds(claim)):
                raise Stopped()
            return call()

        retrying = Retrying(
            retry=retry_if_exception_type(TransientProviderError),
            stop=stop_after_attempt(4),
            wait=wait_exponential_jitter(multiplier=0.05, max=2.0),
            reraise=True,
        )
        return retrying(attempt)


def mark_generated(
    episodes: EpisodeRepository,
    episode_pk: int,
    planned_keys: frozenset[str],
    run_id: str | None,
    plan_id: int | None = None,
) -> bool:
    """Move the episode to ``generated`` once every image of its current plan is completed
    (from allocated only: a decided episode stays decided). `plan_id`: the recorded plan the
    keys come from; if a newer plan was recorded meanwhile, nothing moves (its own images
    decide). Idempotent: a recovery command calls it again after a crash between a run's
    completion and this step. True if every planned image is completed."""
    return episodes.mark_generated(
        episode_pk,
        planned_keys,
        plan_id,
        {"run_id": run_id} if run_id else {"reason": "every planned item completed"},
    )


def _reason(exc: BaseException) -> str:
    """One line for the ledger and the run (a driver's message, not SQLAlchemy's wrapping
    with its statement and background link)."""
    orig = getattr(exc, "orig", None) if isinstance(exc, DBAPIError) else None
    text = f"database error: {orig}" if orig is not None else str(exc)
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    return (line or type(exc).__name__)[:500]
