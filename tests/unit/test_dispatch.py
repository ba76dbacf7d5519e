"""The one dispatch machine (`episodic.pipeline.item_dispatch.dispatch`), driven deterministically.

A fake provider (its free slots), a fake claim side (the run's collectible items, what the
machine tells it) and fake lanes (items started against the provider's slots, one ending per
`endings`) log every step; each test states the whole log the machine must produce. The
lanes come in both kinds: batched (a refused claim is known at once, as the Prefect
executor's `claim_next`) and one claim per item (a refusal comes back as the item's ending,
as the thread executor's workers).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from episodic.core.records import ItemResult, RefusalReason
from episodic.core.runs import Item
from episodic.pipeline.item_dispatch import THROTTLE_POLL_S, Answer, dispatch, thread_pool_executor

Log = list[tuple[Any, ...]]


def _item(pk: int) -> Item:
    return Item(pk, f"k{pk}", pk, f"v{pk}", 1, "p", pk, "pending", 0, None)


class _Provider:
    """The provider profile's slots: `free` of them are this run's to take."""

    def __init__(self, free: int) -> None:
        self.free = free


class _Stop(threading.Event):
    """`stop`, whose poll returns at once: `on_poll` is what happened meanwhile elsewhere."""

    def __init__(self, log: Log, on_poll: Callable[[], None] = lambda: None) -> None:
        super().__init__()
        self.log = log
        self.on_poll = on_poll

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout == THROTTLE_POLL_S
        self.log.append(("poll",))
        self.on_poll()
        return self.is_set()


class _ClaimSide:
    """The part of `ClaimSide` the machine itself uses: collectible items and the waiting word."""

    def __init__(self, log: Log, collectible: list[Item]) -> None:
        self.log = log
        self.own = collectible  # the run's accepted jobs nobody collects (they hold slots)
        self.done: set[int] = set()

    def collectible(self) -> list[Item]:
        found = [item for item in self.own if item.pk not in self.done]
        self.log.append(("collectible", [item.pk for item in found]))
        return found

    def waiting(self, for_slot: bool) -> None:
        self.log.append(("waiting", for_slot))

    def progress(self, item: Item, result: ItemResult) -> None:
        self.done.add(item.pk)
        self.log.append(("progress", item.pk, result))


class _Lanes:
    """Items started against `provider`'s slots; a collectible item needs none (its side holds
    one already). `endings` ends the refused items first (one claim per item), else the
    oldest item in flight, whose slot goes to `provider` unless `taken_elsewhere` says
    another run took it."""

    def __init__(
        self,
        batched: bool,
        provider: _Provider,
        side: _ClaimSide,
        stop: threading.Event,
        log: Log,
        taken_elsewhere: Callable[[Item], bool] = lambda item: False,
        held_elsewhere: frozenset[int] = frozenset(),
    ) -> None:
        self.batched = batched
        self.provider = provider
        self.side = side
        self.stop = stop
        self.log = log
        self.taken_elsewhere = taken_elsewhere
        self.held_elsewhere = held_elsewhere  # claims of these are refused (not throttled)
        self.flight: list[Item] = []
        self.nothing: list[Item] = []  # refused not for a slot: ends with nothing to do
        self.refused: list[Item] = []
        self.max_flight = 0

    @property
    def in_flight(self) -> int:
        return len(self.flight) + len(self.refused) + len(self.nothing)

    @property
    def busy(self) -> int:
        return self.in_flight

    def holding(self) -> set[int]:
        return {item.pk for item in self.flight + self.refused + self.nothing}

    def start(self, queue: deque[Item], room: int) -> bool:
        assert len(self.log) < 200, "the machine spins"  # fail instead of hanging
        if self.stop.is_set() or room <= 0 or not queue:
            return False
        batch = [queue.popleft() for _ in range(min(room, len(queue)))]
        refused = []
        for item in batch:
            if item.pk in self.held_elsewhere:
                if not self.batched:
                    self.nothing.append(item)
            elif item.pk in {it.pk for it in self.side.own}:
                self.flight.append(item)
            elif self.provider.free > 0:
                self.provider.free -= 1
                self.flight.append(item)
            else:
                refused.append(item)
        self.log.append(("start", [it.pk for it in batch], [it.pk for it in refused]))
        self.max_flight = max(self.max_flight, self.in_flight)
        if self.batched:
            queue.extendleft(reversed(refused))
            return bool(refused)
        self.refused.extend(refused)
        return False

    def endings(self) -> Iterator[tuple[Item, Answer]]:
        self.log.append(("endings",))
        if self.nothing:
            nothing, self.nothing = self.nothing, []
            for item in nothing:
                yield item, None
            return
        if self.refused:
            refused, self.refused = self.refused, []
            for item in refused:
                yield item, RefusalReason.THROTTLED
            return
        item = self.flight.pop(0)
        if item.pk not in {it.pk for it in self.side.own} and not self.taken_elsewhere(item):
            self.provider.free += 1
        yield item, ItemResult.COMPLETED

    def abandon(self) -> None:
        self.log.append(("abandon", sorted(self.holding())))


OK = ItemResult.COMPLETED


def test_a_batched_dispatcher_collects_its_own_jobs_first_then_waits_then_resumes() -> None:
    """Every slot is taken: one by the run's own accepted side (item 9, left by a killed
    process), one by another run. The machine collects 9 before it waits; 9's slot goes to
    the other run; with nothing of its own in flight it says it waits and polls; a slot
    frees and the items go on, each claim asking for every free slot."""
    log: Log = []
    provider = _Provider(free=0)
    side = _ClaimSide(log, collectible=[_item(9)])
    stop = _Stop(log, on_poll=lambda: setattr(provider, "free", 1))
    lanes = _Lanes(True, provider, side, stop, log, taken_elsewhere=lambda item: item.pk == 9)

    dispatch([_item(1), _item(2)], side, lanes, 2, stop, side.progress)  # type: ignore[arg-type]

    assert log == [
        ("start", [1, 2], [1, 2]),  # throttled
        ("collectible", [9]),  # collect first: 9 goes to the front
        ("start", [9, 1], [1]),
        ("collectible", [9]),  # 9 is ours in flight: nothing more to collect
        ("endings",),  # throttled with ours in flight: ask again when one ends
        ("waiting", False),
        ("progress", 9, OK),
        ("start", [1, 2], [1, 2]),  # 9's slot went elsewhere
        ("collectible", []),
        ("waiting", True),  # nothing of ours in flight: wait
        ("poll",),
        ("start", [1, 2], [2]),  # the probe asks for every free slot in its one claim
        ("collectible", []),
        ("endings",),
        ("waiting", False),
        ("progress", 1, OK),
        ("start", [2], []),
        ("endings",),
        ("waiting", False),
        ("progress", 2, OK),
    ]


def test_a_dispatcher_claiming_per_item_learns_refusals_from_endings_and_probes_with_one() -> None:
    log: Log = []
    provider = _Provider(free=0)
    side = _ClaimSide(log, collectible=[_item(9)])
    stop = _Stop(log, on_poll=lambda: setattr(provider, "free", 1))
    lanes = _Lanes(False, provider, side, stop, log, taken_elsewhere=lambda item: item.pk == 9)

    dispatch([_item(1), _item(2)], side, lanes, 2, stop, side.progress)  # type: ignore[arg-type]

    assert log == [
        ("start", [1, 2], [1, 2]),
        ("endings",),  # both refused: back at the front (each to the front as it ends)
        ("collectible", [9]),
        ("start", [9, 2], [2]),
        ("endings",),
        ("collectible", [9]),
        ("endings",),  # throttled with 9 in flight: no claim until it ends
        ("waiting", False),
        ("progress", 9, OK),
        ("start", [2, 1], [2, 1]),
        ("endings",),  # each refused item to the front as it ends: 1 is first again
        ("collectible", []),
        ("waiting", True),
        ("poll",),
        ("start", [1], []),  # one claim per item: the probe asks for one
        ("endings",),
        ("waiting", False),
        ("progress", 1, OK),
        ("start", [2], []),
        ("endings",),
        ("waiting", False),
        ("progress", 2, OK),
    ]
    assert lanes.max_flight <= 2


@pytest.mark.parametrize("batched", [True, False])
def test_stop_ends_dispatch_without_starting_the_rest(batched: bool) -> None:
    log: Log = []
    side = _ClaimSide(log, collectible=[])
    stop = _Stop(log)
    lanes = _Lanes(batched, _Provider(free=5), side, stop, log)

    def progress(item: Item, result: ItemResult) -> None:
        side.progress(item, result)
        stop.set()

    dispatch([_item(n) for n in (1, 2, 3)], side, lanes, 1, stop, progress)  # type: ignore[arg-type]
    assert log == [("start", [1], []), ("endings",), ("waiting", False), ("progress", 1, OK)]


def test_a_dispatcher_stopped_while_throttled_neither_collects_nor_says_it_waits() -> None:
    log: Log = []
    side = _ClaimSide(log, collectible=[_item(9)])
    stop = _Stop(log)
    lanes = _Lanes(True, _Provider(free=0), side, stop, log)
    lanes_start = lanes.start

    def start_then_interrupted(queue: deque[Item], room: int) -> bool:
        throttled = lanes_start(queue, room)
        stop.set()
        return throttled

    lanes.start = start_then_interrupted  # type: ignore[method-assign]
    dispatch([_item(1)], side, lanes, 2, stop, side.progress)  # type: ignore[arg-type]
    assert log == [("start", [1], [1])]


@pytest.mark.parametrize("batched", [True, False])
def test_an_exception_stops_dispatch_abandons_what_is_in_flight_and_is_raised(
    batched: bool,
) -> None:
    log: Log = []
    side = _ClaimSide(log, collectible=[])
    stop = _Stop(log)
    lanes = _Lanes(batched, _Provider(free=5), side, stop, log)

    def progress(item: Item, result: ItemResult) -> None:
        raise RuntimeError("progress failed")

    with pytest.raises(RuntimeError, match="progress failed"):
        dispatch([_item(n) for n in (1, 2, 3, 4)], side, lanes, 3, stop, progress)  # type: ignore[arg-type]
    assert stop.is_set()
    assert log[-1] == ("abandon", [2, 3])  # item 1 ended; 2 and 3 were in flight; 4 never


def test_one_claim_fills_every_slot_freed_meanwhile() -> None:
    """Items whose work is over free their slots before they end (the Prefect executor's
    'worked' items): the next claim asks for all of them at once."""
    log: Log = []
    side = _ClaimSide(log, collectible=[])
    stop = _Stop(log)

    class _Worked(_Lanes):
        worked: frozenset[int] = frozenset()

        @property
        def busy(self) -> int:
            return self.in_flight - len(self.worked & self.holding())

        def endings(self) -> Iterator[tuple[Item, Answer]]:
            if len(self.flight) == 3 and not self.worked:
                self.log.append(("endings", "worked"))
                self.worked = frozenset({self.flight[0].pk, self.flight[1].pk})  # slots free
                return iter(())
            return super().endings()

    lanes = _Worked(True, _Provider(free=10), side, stop, log)
    dispatch([_item(n) for n in range(1, 7)], side, lanes, 3, stop, side.progress)  # type: ignore[arg-type]
    assert log[:3] == [("start", [1, 2, 3], []), ("endings", "worked"), ("start", [4, 5], [])]
    assert sorted(pk for kind, pk, *_ in (e for e in log if e[0] == "progress")) == list(
        range(1, 7)
    )


class _ThreadClaimSide:
    """A claim side for the real thread executor: item 1's work fails once item 2 is claimed; item
    2's lasts until the executor is stopped."""

    throttled = False

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.claimed: list[int] = []
        self.lock = threading.Lock()
        self.second = threading.Event()

    def claim(self, item: Item) -> Item:
        with self.lock:
            self.claimed.append(item.pk)
        if item.pk == 2:
            self.second.set()
        return item

    def run(self, claim: Item) -> ItemResult:
        if claim.pk == 1:
            self.second.wait()
            raise RuntimeError("item 1 failed")
        self.stop.wait()
        return ItemResult.COMPLETED

    def waiting(self, for_slot: bool) -> None:  # pragma: no cover - never throttled
        raise AssertionError("never throttled")


def test_the_thread_executor_stops_on_a_workers_error_and_raises_it_once_the_rest_ended() -> None:
    stop = threading.Event()
    side = _ThreadClaimSide(stop)
    seen: list[int] = []
    with pytest.raises(RuntimeError, match="item 1 failed"):
        thread_pool_executor(
            [_item(n) for n in (1, 2, 3, 4)],
            side,  # type: ignore[arg-type]
            2,
            stop,
            lambda item, result: seen.append(item.pk),
        )
    assert stop.is_set()  # item 2's worker ended only because the error stopped dispatch
    assert sorted(side.claimed) == [1, 2]  # nothing claimed after the error
    assert seen == []  # an item ending after the error is not reported as worked


@pytest.mark.parametrize("batched", [True, False])
def test_a_collectible_item_refused_for_another_reason_is_offered_once_per_wait(
    batched: bool,
) -> None:
    """Item 9 is listed collectible, yet its claim is refused as busy (another holder took it
    over between the read and the claim); every slot is another run's. The machine offers 9
    once, then waits and polls: once per poll at most, never a claim per pass (it spun)."""
    log: Log = []
    polls = 0

    def on_poll() -> None:
        nonlocal polls
        polls += 1
        if polls == 3:
            stop.set()

    provider = _Provider(free=0)
    side = _ClaimSide(log, collectible=[_item(9)])
    stop = _Stop(log, on_poll=on_poll)
    lanes = _Lanes(batched, provider, side, stop, log, held_elsewhere=frozenset({9}))

    dispatch([_item(1)], side, lanes, 2, stop, side.progress)  # type: ignore[arg-type]

    assert polls == 3
    offers = [entry for entry in log if entry[0] == "start" and 9 in entry[1]]
    assert 1 <= len(offers) <= polls  # once before the first wait, then at most once per poll
    assert len(log) < 60
