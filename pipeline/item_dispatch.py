"""The dispatch of a run's items: how they are claimed and run, at most `concurrency` at a
time, by any executor.

One dispatch machine (`dispatch`) drives every executor; an executor is only its `Lanes`:
how its items are started and how their endings are reported. The CLI's executor is
`thread_pool_executor` (a worker thread claims its item, then runs it); the Prefect flow's
(`episodic.tasks.prefect_executor`) claims batches and runs each item as a cached task. Both
claim an item before any work on it (`ClaimSide`), keep an item refused only for a provider
slot and ask for it again (`claim_next`, `collect_first`), and stop dispatching on `stop`.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Literal, Protocol

from episodic.core.records import ItemResult, RefusalReason
from episodic.core.runs import INTERRUPTED, Claim, Item

if TYPE_CHECKING:
    from episodic.pipeline.runner import Runner

Progress = Callable[[Item, ItemResult], None]
"""Told how each item this process worked ended."""


class ClaimSide(Protocol):
    """What an executor drives: claim an item (None: not ours to do now), then run it.

    After a None, `throttled` says whether the item was refused only because the provider's
    limit of items in flight is reached: the executor keeps it and asks again once a slot
    may have freed, instead of moving on.
    """

    run_id: str
    owner: str
    runner: Runner  # the run's runner: an item task in the same process may share it

    @property
    def throttled(self) -> bool: ...

    @property
    def profile_id(self) -> str: ...

    def claim(self, item: Item) -> Claim | None: ...

    def claim_many(self, items: Sequence[Item]) -> list[Claim | None]: ...

    def was_throttled(self, item: Item) -> bool: ...

    def take(self, item_pk: int) -> Claim: ...

    def run(self, claim: Claim) -> ItemResult: ...

    def abandon(self, claim: Claim, reason: str = INTERRUPTED) -> None: ...

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
        claims: ClaimSide,
        concurrency: int,
        stop: threading.Event,
        progress: Progress,
    ) -> None: ...


THROTTLE_POLL_S = 0.25  # how often a throttled executor asks again for a provider slot


def claim_next(
    queue: deque[Item], claims: ClaimSide, stop: threading.Event, room: int
) -> tuple[list[tuple[Item, Claim]], bool]:
    """Claim up to `room` items from the front of `queue` in one transaction (the
    dispatching executors' rule: one write fills every free slot).

    Returns the claims and whether the provider's limit stopped it: the throttled items go
    back to the front of the queue, in order, so they are asked for again first.
    """
    if stop.is_set() or room <= 0 or not queue:
        return [], False
    batch = [queue.popleft() for _ in range(min(room, len(queue)))]
    answers = claims.claim_many(batch)
    claimed = [(item, claim) for item, claim in zip(batch, answers, strict=True) if claim]
    if not claims.throttled:
        return claimed, False
    held = {item.pk for item, _ in claimed}
    back = [item for item, claim in zip(batch, answers, strict=True) if claim is None]
    throttled = [item for item in back if item.pk not in held and claims.was_throttled(item)]
    queue.extendleft(reversed(throttled))
    return claimed, True


def collect_first(
    queue: deque[Item], claims: ClaimSide, working: set[int], offered: set[int] | None = None
) -> bool:
    """A throttled dispatcher's first step: put the run's collectible items (`ClaimSide.
    collectible`: accepted jobs nobody collects, left by a killed or interrupted process of
    the run, taken over from an expired claim, or left for later by this one) at the front of
    `queue`, except those in `working` (this dispatcher's items in flight). Their jobs hold
    the very slots the throttle counts, and collecting one needs no slot, so a recovering run
    collects them before it waits (after `kill -9` it waited for `max_job_s` behind them).
    Items in `offered` (put at the front since the dispatcher last waited) are not offered
    again: one whose claim was refused for another reason (taken over meanwhile) would
    otherwise be asked for on every pass, a claim transaction each, and the dispatcher would
    never reach its wait. Those found are added to `offered`. Returns whether any was found
    (the caller claims them at once)."""
    skip = working if offered is None else working | offered
    found = [item for item in claims.collectible() if item.pk not in skip]
    if not found:
        return False
    if offered is not None:
        offered.update(item.pk for item in found)
    first = {item.pk for item in found}
    rest = [item for item in queue if item.pk not in first]
    queue.clear()
    queue.extend(found + rest)
    return True


# How an item's work ended, as a dispatcher learns it: its result, refused for a provider slot
# only (the item goes back to the front of the queue), or None: nothing for this process to do.
Answer = ItemResult | Literal[RefusalReason.THROTTLED] | None


class Lanes(Protocol):
    """How a dispatcher's items are started and how their endings are reported (`dispatch`).

    `batched`: True when `start` claims all its items in one transaction, so a throttled
    dispatcher's probe asks for every free slot at no extra cost; False when each item is one
    claim (a probe asks for one item: more would be more refused claims per poll).
    """

    batched: bool

    @property
    def in_flight(self) -> int:
        """Items started and not yet ended (their claims are this dispatcher's)."""

    @property
    def busy(self) -> int:
        """Of `concurrency`'s slots, how many the items in flight hold (an item whose work is
        over but whose task still finishes holds none)."""

    def holding(self) -> set[int]:
        """The pks of the items in flight."""

    def start(self, queue: deque[Item], room: int) -> bool:
        """Start up to `room` items from the front of `queue` (none once `stop` is set), and
        say whether the claim was refused for a provider slot (the refused items back at the
        front of `queue`). A lane that learns that only when the item ends says False here
        and `RefusalReason.THROTTLED` in `endings`."""

    def endings(self) -> Iterator[tuple[Item, Answer]]:
        """Block until at least one item in flight ended or freed its slot, then yield each
        item that ended, with its answer (none when only slots freed)."""

    def abandon(self) -> None:
        """On an exception: cancel or release what is in flight (`dispatch` re-raises)."""


def dispatch(
    items: Sequence[Item],
    claims: ClaimSide,
    lanes: Lanes,
    concurrency: int,
    stop: threading.Event,
    progress: Progress,
) -> None:
    """The one dispatch state machine: start `items` through `lanes`, at most `concurrency`
    (>= 1) holding slots at once, until every item ended, or `stop` is set.

    Throttled (the provider profile's limit of items in flight is reached; the refused item
    is back at the front of the queue): first claim the run's own collectible items
    (`collect_first`: collecting needs no slot); else, with items of ours in flight, ask
    again when one of them ends (its slot frees); with none, tell `claims.waiting(True)` and
    probe every `THROTTLE_POLL_S`. Each item ended with a result tells `claims.waiting(False)`
    and `progress`; an image the media store could not take (`ItemResult.NOT_STORED`: the
    run was paused) sets `stop`. On an exception: set `stop`, `lanes.abandon()`, re-raise.
    """
    queue = deque(items)
    throttled = False
    offered: set[int] = set()  # collectible items put first since the last wait or result
    try:
        while queue or lanes.in_flight:
            if (
                throttled
                and not stop.is_set()
                and collect_first(queue, claims, lanes.holding(), offered)
            ):
                throttled = False  # our slots are held by jobs we can collect: do it
            elif throttled and not lanes.in_flight:
                if stop.is_set():
                    break
                claims.waiting(True)  # every slot is another run's: probe every 0.25 s
                offered.clear()
                if stop.wait(THROTTLE_POLL_S):
                    break
            if not throttled or not lanes.in_flight:  # throttled with ours in flight: a slot
                room = concurrency - lanes.busy  # frees when one of ours ends: ask again then
                throttled = lanes.start(queue, room if lanes.batched or not throttled else 1)
                if throttled:
                    continue
            if not lanes.in_flight:
                if stop.is_set() or not queue:
                    break
                continue  # what was asked for was busy or done elsewhere: the next ones
            throttled = False
            for item, answer in lanes.endings():
                if answer is RefusalReason.THROTTLED:
                    queue.appendleft(item)
                    throttled = True
                elif answer is not None:
                    if answer in (ItemResult.NOT_STORED, ItemResult.THROTTLED):
                        stop.set()  # the run is paused: buy no more
                    offered.clear()  # an item of ours ended: what is collectible may differ
                    claims.waiting(False)
                    progress(item, answer)
    except BaseException:
        stop.set()
        lanes.abandon()
        raise


class _ThreadLanes:
    """Each item is a worker thread that claims it, then runs it: claims (a short write
    transaction each) overlap with other items' provider calls."""

    batched = False

    def __init__(self, pool: ThreadPoolExecutor, claims: ClaimSide, stop: threading.Event) -> None:
        self.pool = pool
        self.claims = claims
        self.stop = stop
        self.pending: dict[Future[Answer], Item] = {}

    @property
    def in_flight(self) -> int:
        return len(self.pending)

    @property
    def busy(self) -> int:
        return len(self.pending)

    def holding(self) -> set[int]:
        return {item.pk for item in self.pending.values()}

    def _claim_and_run(self, item: Item) -> Answer:
        if self.stop.is_set():
            return None
        claim = self.claims.claim(item)  # `throttled` is this (the worker's) thread's answer
        if claim is None:
            return RefusalReason.THROTTLED if self.claims.throttled else None
        return self.claims.run(claim)

    def start(self, queue: deque[Item], room: int) -> bool:
        for _ in range(min(room, len(queue))):
            if self.stop.is_set():
                break
            item = queue.popleft()
            self.pending[self.pool.submit(self._claim_and_run, item)] = item
        return False  # a worker's refusal comes back as its answer

    def endings(self) -> Iterator[tuple[Item, Answer]]:
        done, _ = wait(self.pending, return_when=FIRST_COMPLETED)
        for future in done:
            item = self.pending.pop(future)
            yield item, future.result()

    def abandon(self) -> None:
        for future in self.pending:
            future.cancel()
        wait(self.pending)


def thread_pool_executor(
    items: Sequence[Item],
    claims: ClaimSide,
    concurrency: int,
    stop: threading.Event,
    progress: Progress,
) -> None:
    """The CLI's executor: each of `concurrency` workers claims its item and runs it, so
    claims (a short write transaction each) overlap with other items' provider calls."""
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="item") as pool:
        dispatch(items, claims, _ThreadLanes(pool, claims, stop), concurrency, stop, progress)
