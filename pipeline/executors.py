"""Executors: how a run's items are claimed and run, at most `concurrency` at a time.

The CLI's executor is `thread_pool_executor`; the Prefect flow's (`tasks.executor`) runs each
item as a cached task. Both claim an item before any work on it (`ItemJob`), keep an item
refused only for a provider slot and ask for it again (`claim_next`, `collect_first`), and
stop dispatching on `stop`.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Literal, Protocol

from core.records import ItemResult, RefusalReason
from core.runs import INTERRUPTED, Claim, Item

if TYPE_CHECKING:
    from pipeline.runner import Runner

Progress = Callable[[Item, ItemResult], None]
"""Told how each item this process worked ended."""


class ItemJob(Protocol):
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
        job: ItemJob,
        concurrency: int,
        stop: threading.Event,
        progress: Progress,
    ) -> None: ...


THROTTLE_POLL_S = 0.25  # how often a throttled executor asks again for a provider slot


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


# A worker's answer: how its item ended, refused for a provider slot only, or nothing to do.
_Answer = ItemResult | Literal[RefusalReason.THROTTLED] | None


def thread_pool_executor(
    items: Sequence[Item],
    job: ItemJob,
    concurrency: int,
    stop: threading.Event,
    progress: Progress,
) -> None:
    """The CLI's executor: each of `concurrency` workers claims its item and runs it, so
    claims (a short write transaction each) overlap with other items' provider calls."""

    def claim_and_run(item: Item) -> _Answer:
        if stop.is_set():
            return None
        claim = job.claim(item)
        if claim is None:
            return RefusalReason.THROTTLED if job.throttled else None
        return job.run(claim)

    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="item") as pool:
        pending: dict[Future[_Answer], Item] = {}
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
                    answer = future.result()
                    if answer is RefusalReason.THROTTLED:
                        queue.appendleft(item)
                        throttled = True
                    elif answer is not None:
                        job.waiting(False)
                        progress(item, answer)
        except BaseException:
            stop.set()
            for future in pending:
                future.cancel()
            wait(pending)
            raise
