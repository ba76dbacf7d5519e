"""One process's part in a run: claim the run's items, work them, then conclude
the run. No Prefect.

The CLI and the Prefect flow share the `Runner`; they differ only in the `ItemExecutor` that
runs the per-item work (`pipeline.item_dispatch.thread_pool_executor`, or cached Prefect tasks in
`episodic.tasks.prefect_executor`).

How a run spends money exactly once:

- **Claims.** Before any paid call the executor *claims* the item (`episodic.storage.claims`): one
  transaction checks the run is running, takes the item with a lease and commits the intent
  of the paid call. Several runs, processes or Prefect workers on one episode split its
  items; an item held by another live claim is *followed* (this run waits for it and reports
  it completed when its holder finishes), never bought twice.
- **Leases and heartbeats** (`episodic.pipeline.heartbeat`): a cancel or a pause from anywhere stops
  this process at the next item. A killed holder's lease expires and another run takes over;
  the intent it left behind is reconciled, never resubmitted.
- **The paid call** (`pipeline.paid_call`): errors by what they prove (`providers.base`):
  refused → the item fails (a retry is a new attempt); unknown → the submission is
  reconciled, never a new paid call; accepted → collected, across runs, until the provider
  says the job failed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field, replace

from episodic.core.errors import CommandNotAllowed, InvalidTransition
from episodic.core.hints import counted
from episodic.core.planning import RunOptions
from episodic.core.records import ItemResult
from episodic.core.runs import (
    BUDGET_STOPPED,
    INTERRUPTED,
    PRICE_STOPPED,
    STORE_STOPPED,
    Claim,
    Item,
)
from episodic.core.states import RunState
from episodic.pipeline.admission import runnable_items
from episodic.pipeline.gate import GatePass
from episodic.pipeline.heap import freeze_for_run, thaw_after_run
from episodic.pipeline.heartbeat import Heartbeat
from episodic.pipeline.item_claims import ItemClaims
from episodic.pipeline.item_claims import new_owner as new_owner  # (re-exported: tests, bench)
from episodic.pipeline.item_dispatch import ItemExecutor, thread_pool_executor
from episodic.pipeline.outcomes import RunOutcome, Worked, run_ended
from episodic.pipeline.paid_call import PaidCall
from episodic.pipeline.resolve import reason
from episodic.providers.base import Provider
from episodic.providers.profiles import Profile
from episodic.storage.budgets import PRICE_MARK
from episodic.storage.cancels import CancelStore
from episodic.storage.claims import ClaimStore
from episodic.storage.episodes import EpisodeRepository
from episodic.storage.leases import LeaseStore
from episodic.storage.ledger import LedgerStore
from episodic.storage.media import MediaStore
from episodic.storage.plans import PlanStore
from episodic.storage.runs import RunStore
from episodic.storage.throttles import ThrottleStore


@dataclass
class Runner:
    """One process's part in runs of one episode: `execute` works a run's items with
    `executor` until they are done, failed or the run is stopped, then concludes it; each
    claimed item goes through `paid` (`PaidCall`), the one place the provider is called."""

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
    media: MediaStore  # where paid images are kept (`episodic.pipeline.media.keep_image`)
    executor: ItemExecutor = thread_pool_executor
    stop: threading.Event = field(default_factory=threading.Event)
    # Set with `stop` by this process's own interrupt (Ctrl-C, SIGTERM) when the caller can
    # tell it apart from a stop from elsewhere: the run is paused, as when the interrupt is
    # raised here as KeyboardInterrupt (which a library may swallow on its way).
    interrupted: threading.Event = field(default_factory=threading.Event)
    on_progress: Callable[[Item, ItemResult], None] = lambda item, result: None
    # Called with a line when the run starts waiting for a provider slot, None when it goes on.
    on_wait: Callable[[str | None], None] = lambda text: None
    planned_keys: frozenset[str] = frozenset()
    plan_id: int | None = None  # the recorded plan `planned_keys` come from
    reference_image: str | None = None  # the plan's reference image, a data: URI
    follow_poll_s: float = 0.5
    paid: PaidCall = field(init=False)

    def __post_init__(self) -> None:
        self.paid = PaidCall(
            self.store,
            self.leases,
            self.ledger,
            self.cancels,
            self.gate,
            self.provider,
            self.profile,
            self.media,
            self.stop,
            self.reference_image,
            ThrottleStore(self.claims.engine),
        )

    def process(self, claim: Claim, options: RunOptions) -> ItemResult:
        """Take one claimed item as far as it goes (`PaidCall.process`). Never pays twice."""
        return self.paid.process(claim, options)

    def execute(
        self,
        run_id: str,
        options: RunOptions,
        skipped: int = 0,
        *,
        deduplicated: bool = False,
        joined_live: bool = False,
    ) -> RunOutcome:
        """Run (or join) `run_id` until its items are done, failed, or it is stopped.

        `deduplicated` only labels the outcome (the caller's request was answered by an
        existing run). `joined_live`: a resume found the run live (its lease not yet
        expired); its outcome says ``deduplicated`` only when another process really did
        some of the work while this one ran (an item held elsewhere that this process did
        not work to its end). A resume of a run whose process was killed finds its lease
        still live, takes its items over once their leases run out and does all the work:
        nothing was working on it, and its outcome does not say it joined a working run.
        """
        items = runnable_items(self.store, self.plans, self.gate.episode_pk, run_id, options)
        side = ItemClaims(self, run_id, new_owner(), options)
        ended = self._start(run_id, side.owner, options.lease_s)
        if ended is not None:  # the run we joined finished meanwhile: its outcome is ours
            outcome = self._outcome(run_id, ended, skipped, ())
            return replace(outcome, deduplicated=deduplicated or joined_live)
        heartbeat = Heartbeat(self, side.owner, run_id, options.lease_s, self.stop)
        heartbeat.start()
        freeze_for_run()  # no full garbage collection walks the whole heap mid-run
        interrupted = False
        concurrency = max(1, min(options.concurrency, self.provider.capabilities.max_concurrency))

        def progress(item: Item, result: ItemResult) -> None:
            side.ended(item, result)
            self.on_progress(item, result)

        try:
            everything = items
            items = self._settle_first(run_id, side, items, concurrency, progress)
            while items:
                side.busy.clear()
                self.executor(items, side, concurrency, self.stop, progress)
                if self.stop.is_set():
                    break
                items, follow = self._next_pass(run_id, side, items, everything)
                if follow:
                    self.stop.wait(self.follow_poll_s)
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM of this process: it pauses the run
            interrupted = True
            self.stop.set()
        except Exception as exc:
            self.stop.set()
            self.leases.release_all(side.owner, f"error: {reason(exc)}")
            self._move(run_id, RunState.FAILED, f"error: {reason(exc)}")
            raise
        except BaseException:  # a termination signal (a cancelled flow run gets SIGTERM)
            self.stop.set()
            self._pause(run_id, side.owner)
            raise
        finally:
            side.abandon_untaken()
            heartbeat.done.set()
            thaw_after_run()
        followed = tuple(sorted(side.followed))
        if self.stop.is_set():
            interrupted = interrupted or self.interrupted.is_set()
            outcome = self._stopped(run_id, side.owner, skipped, followed, interrupted)
        elif side.over_budget is not None or self.paid.price_breach is not None:
            outcome = self._over_budget(run_id, side, skipped, followed)
        else:
            outcome = self.finish(run_id, skipped, followed)
        shared = joined_live and bool(side.held_elsewhere - side.worked_here)
        return replace(outcome, deduplicated=deduplicated or shared)

    def _settle_first(
        self,
        run_id: str,
        side: ItemClaims,
        items: list[Item],
        concurrency: int,
        progress: Callable[[Item, ItemResult], None],
    ) -> list[Item]:
        """Recovery collects first: before anything is bought, a pass over the items that
        have a submission open (an accepted job, an unanswered intent, an unknown outcome:
        left by a killed or interrupted process, or by this run's earlier attempts) whose
        claims only settle (`ItemClaims.settle_only`): collecting costs nothing new, and every
        later decision about buying (the caps, the budgets) then counts what these jobs
        really cost rather than their reservations. An item held by another live claim is
        left to the passes after, which follow it (and collect it once its holder's lease
        runs out, whatever the budget). Returns the items still to work."""
        side.open_items = self.store.with_open_submission(run_id)
        first = [it for it in items if it.pk in side.open_items]
        if not first:
            return items
        side.settle_only = True
        try:
            self.executor(first, side, concurrency, self.stop, progress)
        finally:
            side.settle_only = False
        return [it for it in items if it.pk not in side.finished]

    def _next_pass(
        self, run_id: str, side: ItemClaims, items: list[Item], everything: list[Item]
    ) -> tuple[list[Item], bool]:
        """After a pass over `items`: the items of the next pass (none: this process is
        done with the run), and whether they are followed (polled after a wait) rather
        than worked at once. Once it stopped buying at a limit (`ItemClaims.over_budget`), a
        process still follows what other claims hold and collects what is left open of
        `everything` (the run's items it listed) and not worked here yet, once each: a job
        accepted at the provider is never left behind by a run that stops at its budget."""
        if side.busy:  # held by other live claims: finished, taken over, or given up
            side.no_retry.update(side.busy)
            waiting = set(side.busy)
            return [it for it in items if it.pk in waiting], True
        # Items another process claimed after this one listed them: the run is not over
        # while they run, so they are followed (and taken over if their holder dies): this
        # process never concludes the run under another's feet.
        held = self.store.held_elsewhere(run_id, side.owner)
        if held:
            return held, True
        if side.over_budget is not None:
            side.open_items = self.store.with_open_submission(run_id)
            done = side.finished | side.tried_open  # worked here already: not asked again
            left = [it for it in everything if it.pk in side.open_items and it.pk not in done]
            side.tried_open.update(it.pk for it in left)
            return left, False
        # What a process of this run (this one too) gave up unfinished: this one finishes
        # it, once each.
        unfinished = [it for it in self.store.unfinished(run_id) if it.pk not in side.taken_back]
        if unfinished:
            side.taken_back.update(it.pk for it in unfinished)
            side.no_retry.difference_update(side.taken_back)
        return unfinished, False

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
            # not a run paused at a media store failure: that waits for an explicit resume
            self._move(run_id, RunState.RUNNING, keep_store_stop=True)
        if done:
            state = self._move(run_id, RunState.COMPLETED)
        else:
            state = self._move(run_id, RunState.FAILED, f"{counted(counts.failed, 'item')} failed")
        return self._outcome(run_id, state, skipped, followed)

    def reopen(self, run_id: str, lease_s: float) -> RunState:
        """Move a failed run back to running for this process, which still has work on it
        (another process concluded it, or the sweep reaped it while this one was frozen);
        returns the state it is in now. Claims stay guarded: nothing is paid twice. A run
        paused at a media store failure stays paused (`PaidCall.stop_buying`)."""
        with suppress(InvalidTransition):  # a store failure's pause is not reopened here
            self.store.transition_run(
                run_id, RunState.RUNNING, lease_s=lease_s, keep_store_stop=True
            )
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

    def _move(
        self,
        run_id: str,
        target: RunState,
        error_text: str | None = None,
        *,
        keep_store_stop: bool = False,
    ) -> RunState:
        """Move the run if it still can; the state it ends in (a concurrent move may win)."""
        with suppress(InvalidTransition):
            self.store.transition_run(run_id, target, error_text, keep_store_stop=keep_store_stop)
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

    def _over_budget(
        self, run_id: str, side: ItemClaims, skipped: int, followed: tuple[str, ...]
    ) -> RunOutcome:
        """A claim refused a new paid call at a cap or a budget and this process's calls in
        flight are done: the run is paused with the reason (`BUDGET_STOPPED`: no process
        reopens it; `runs resume` with a bigger limit goes on), unless nothing is left. A
        charge above the price's bound pauses it even then (`PRICE_STOPPED`): the price is
        wrong for every later call, and the run's line and `runs show` must say so."""
        counts = self.store.counts(run_id)
        done = not (counts.failed or counts.pending or counts.running)
        if done and self.paid.price_breach is None:
            return self.finish(run_id, skipped, followed)
        if done:
            self.mark_generated(run_id)
        self.leases.release_all(side.owner, INTERRUPTED)
        if self.paid.price_breach is not None:  # a charge this process saw, with its job
            why = f"{PRICE_STOPPED} {self.paid.price_breach}"[:2000]
        elif (side.over_budget or "").startswith(PRICE_MARK):  # seen by another process
            why = f"{STORE_STOPPED} {side.over_budget}"[:2000]
        else:
            why = f"{BUDGET_STOPPED} {side.over_budget}"[:2000]
        state = self._move(run_id, RunState.PAUSED, why)
        return self._outcome(run_id, state, skipped, followed, side)

    def mark_generated(self, run_id: str | None) -> None:
        """The episode is generated once every image of its current plan is completed."""
        mark_generated(self.episodes, self.gate.episode_pk, self.planned_keys, run_id, self.plan_id)

    def _outcome(
        self,
        run_id: str,
        state: RunState,
        skipped: int,
        followed: tuple[str, ...],
        side: ItemClaims | None = None,
    ) -> RunOutcome:
        counts = self.store.counts(run_id)
        if state == RunState.COMPLETED:
            self.mark_generated(run_id)
        here = None if side is None else Worked(side.completed_here, side.collected_earlier)
        return run_ended(
            self.store, self.gate, run_id, state, counts, skipped, followed, self.profile, here
        )


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
