"""One process's claims on one run's items (`ItemClaims`), and the items it found held
elsewhere: the claim side (`ClaimSide`) that the dispatch machine of a
`episodic.pipeline.runner.Runner`'s executor drives."""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from episodic.core.planning import RunOptions
from episodic.core.records import ClaimAction, ItemResult, RefusalReason
from episodic.core.runs import INTERRUPTED, THROTTLE_STOPPED, Claim, Item, Refusal
from episodic.pipeline.throttle import held_too_long, throttle_text
from episodic.storage.base import utcnow
from episodic.storage.throttles import ThrottleStore
from episodic.storage.tx import is_lost_connection

if TYPE_CHECKING:
    from episodic.pipeline.runner import Runner


def new_owner() -> str:
    """A claim owner: host, process and a random part (readable in `runs show`)."""
    return f"{socket.gethostname()[:24]}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


@dataclass
class ItemClaims:
    """One process's claims on one run's items, and the items it found held elsewhere (the
    `ClaimSide` its executor drives)."""

    runner: Runner
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
    # why a claim refused a new paid call at a cap or a budget: this process buys nothing
    # more, finishes what it has in flight, then pauses the run (`Runner._over_budget`)
    over_budget: str | None = None
    # Claims only settle open submissions (collect, reconcile), never make a new paid call:
    # a recovery's first pass (`Runner.execute`), and every claim once `over_budget` is set.
    settle_only: bool = False
    # The run's items with a submission open, as last read (`RunStore.with_open_submission`):
    # once this process stopped buying, only these are worth a claim.
    open_items: set[int] = field(default_factory=set)
    # Items this process claimed to settle an open submission, and how many of its items
    # it completed: of them (`collected_earlier`), and in all (`Runner.execute` counts).
    settling: set[int] = field(default_factory=set)
    completed_here: int = 0
    collected_earlier: int = 0
    finished: set[int] = field(default_factory=set)  # items that ended here, or were done
    # Items found held by another claim, and items this process worked to their end: an
    # item of the first not in the second ended (or is still) in another process's hands,
    # the only sign that this process joined a run some other one was working on.
    held_elsewhere: set[int] = field(default_factory=set)
    worked_here: set[int] = field(default_factory=set)
    tried_open: set[int] = field(default_factory=set)  # open ones asked for once stopped

    @property
    def profile_id(self) -> str:
        return self.runner.profile.id

    @property
    def throttled(self) -> bool:
        """This thread's last claim was refused for a provider slot only."""
        return bool(getattr(self._local, "throttled", False))

    def claim_many(self, items: Sequence[Item]) -> list[Claim | None]:
        """`claim` for several items in one transaction; refused ones are handled as in
        `claim` (throttled ones are remembered for `was_throttled`)."""
        runner = self.runner
        settle_only = self.settle_only or self.over_budget is not None
        if self.over_budget is not None:  # stopped buying: what has a call open is settled
            asked = [item for item in items if item.pk in self.open_items]
            if not asked:  # every one would need a new paid call: no claim, no transaction
                self._local.throttled_pks = set()  # (not waiting: a stale answer would
                self._local.throttled = False  # have the executor ask again forever)
                return [None for _ in items]
            if len(asked) < len(items):
                answered = iter(self.claim_many(asked))
                return [next(answered) if it.pk in self.open_items else None for it in items]
        since = utcnow()
        try:
            answers = runner.claims.claim_many(
                [(item.pk, item.pk not in self.no_retry) for item in items],
                self.run_id,
                self.owner,
                lease_s=self.options.lease_s,
                max_attempts=self.options.max_attempts,
                profile=runner.profile.id,
                provider_limit=runner.profile.max_concurrency,
                max_job_s=runner.profile.max_job_s,
                reserve=runner.paid.reservation,
                guard=runner.paid.guard(self.run_id, self.options),
                settle_only=settle_only,
            )
        except Exception as exc:
            if not is_lost_connection(exc):
                raise
            # Its COMMIT may have happened, but nothing it made was received, so nothing was
            # sent: give it all back (the store retries that through the outage), and the
            # items are asked for again after a short wait, as throttled ones are. The run
            # goes on instead of ending on a claim whose outcome is now known.
            runner.leases.give_back_unreceived(self.owner, [it.pk for it in items], since)
            self._local.throttled_pks = {item.pk for item in items}
            self._local.throttled = True
            return [None for _ in items]
        self._local.throttled_pks = set()
        out: list[Claim | None] = []
        reopen = False
        held: datetime | None = None  # the profile's throttle, when it outlasts one wait
        for item, got in zip(items, answers, strict=True):
            if isinstance(got, Claim):
                with self.guard:
                    self.claims[item.pk] = got
                    self.busy.pop(item.pk, None)  # found held before, now ours (collected)
                    if got.action != ClaimAction.SUBMIT:
                        self.settling.add(item.pk)
                out.append(got)
                continue
            if got.reason in (RefusalReason.THROTTLED, RefusalReason.REOPEN):  # asked again
                self._local.throttled_pks.add(item.pk)  # after a short wait
                reopen = reopen or got.reason == RefusalReason.REOPEN
                if got.until is not None and held_too_long(got.until):
                    held = got.until
            else:
                self._refused(item, got)
            out.append(None)
        self._local.throttled = bool(self._local.throttled_pks)
        if held is not None:
            self._pause_at_throttle(held)
        if reopen and not runner.stop.is_set():  # this process still has work (and is not
            runner.reopen(self.run_id, self.options.lease_s)  # stopping): the run goes on
        return out

    def _pause_at_throttle(self, until: datetime) -> None:
        """The provider's throttle of this profile, recorded by any process, ends later than
        one wait is bound to: the run pauses as the create that heard it paused its own
        (`episodic.pipeline.throttle`), nothing sent, rather than wait or ask inside the window."""
        runner = self.runner
        if runner.stop.is_set():
            return
        recorded = (
            None
            if runner.paid.throttles is None
            else runner.paid.throttles.holding(runner.profile.id)
        )
        said = recorded[1] if recorded is not None else "throttled"
        text = throttle_text(runner.profile.id, said, until)
        runner.paid.stop_buying(self.run_id, text, THROTTLE_STOPPED)
        runner.stop.set()

    def was_throttled(self, item: Item) -> bool:
        """The last `claim_many` of this thread refused `item` for a provider slot."""
        return item.pk in getattr(self._local, "throttled_pks", set())

    def claim(self, item: Item) -> Claim | None:
        """Claim one item (`claim_many` of one): None when refused, `throttled` says why."""
        (got,) = self.claim_many([item])
        return got

    def _refused(self, item: Item, refusal: Refusal) -> None:
        if refusal.reason == RefusalReason.BUSY:
            self.busy[item.pk] = refusal.holder_run or "?"
            self.held_elsewhere.add(item.pk)
            if refusal.holder_run and refusal.holder_run != self.run_id:
                self.followed.add(refusal.holder_run)
        elif refusal.reason == RefusalReason.STOPPED:
            self.runner.stop.set()
        elif refusal.reason == RefusalReason.THROTTLED:
            pass  # the executor keeps the item and asks again
        elif refusal.reason == RefusalReason.SETTLE_ONLY:
            pass  # it needs a new paid call: a later pass decides (or the limit stopped it)
        elif refusal.reason == RefusalReason.BUDGET:
            self.over_budget = self.over_budget or refusal.detail or "a cap or budget"
        else:  # done, exhausted, failed: nothing for this process to do
            with self.guard:
                self.finished.add(item.pk)
            done = refusal.reason == RefusalReason.DONE
            self.runner.on_progress(item, ItemResult.COMPLETED if done else ItemResult.SKIPPED)

    def ended(self, item: Item, result: ItemResult) -> None:
        """Count an item this process worked to its end (`Runner.execute`'s progress)."""
        with self.guard:
            self.finished.add(item.pk)
            self.worked_here.add(item.pk)
        if result == ItemResult.COMPLETED:
            with self.guard:
                self.completed_here += 1
                self.collected_earlier += int(item.pk in self.settling)

    def take(self, item_pk: int) -> Claim:
        """The claim made for `item_pk` (executors that run items elsewhere look it up)."""
        with self.guard:
            return self.claims.pop(item_pk)

    def run(self, claim: Claim) -> ItemResult:
        with self.guard:
            self.claims.pop(claim.item.pk, None)
        return self.runner.process(claim, self.options)

    def abandon(self, claim: Claim, reason: str = INTERRUPTED) -> None:
        """Give up a claim whose work never started: the intent was never sent."""
        with self.guard:
            self.claims.pop(claim.item.pk, None)
        self.runner.paid.withdraw_unsent(claim)
        self.runner.leases.release(claim, reason)

    def release(self, claim: Claim) -> None:
        """Free a claim whose worker ended without finishing (a lost Dask worker, a crashed
        task): the item becomes failed and resumable. A task that never loaded its claim
        sent nothing, and its intent is withdrawn; an intent it may have sent stays open
        and is reconciled by the next claim, never resubmitted (`release_unstarted`)."""
        self.runner.leases.release_unstarted(claim, INTERRUPTED)

    def collectible(self) -> list[Item]:
        """The run's items whose jobs hold provider slots and that it may collect now
        (`RunStore.collectible`)."""
        return self.runner.store.collectible(self.run_id, self.profile_id)

    def waiting(self, for_slot: bool) -> None:
        """Tell the runner's `on_wait` once each time this process starts or stops waiting for
        a provider slot (a run whose every slot is taken elsewhere shows why it stands still)."""
        if for_slot == self._waiting_for_slot:
            return
        self._waiting_for_slot = for_slot
        text = f"waiting for a provider slot (profile {self.profile_id}: every slot in use)"
        held = (
            ThrottleStore(self.runner.claims.engine).held_until(self.profile_id)
            if for_slot
            else None
        )
        if held is not None:  # the provider asked every worker of the profile to wait
            text = (
                f"waiting: provider profile {self.profile_id} throttled until {held:%H:%M:%S} UTC"
            )
        self.runner.on_wait(text if for_slot else None)

    def abandon_untaken(self) -> None:
        """Claims made but never run (a cancelled future, a task that never started)."""
        with self.guard:
            left = list(self.claims.values())
        for claim in left:
            self.abandon(claim)
