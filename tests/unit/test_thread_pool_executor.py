"""The thread-pool executor under a provider limit held elsewhere (no database)."""

from __future__ import annotations

import threading
from typing import Any

from episodic.core.runs import Item
from episodic.pipeline.item_dispatch import THROTTLE_POLL_S, thread_pool_executor


class _AlwaysThrottled:
    """Every slot is another run's: every claim is refused for a provider slot."""

    run_id = "run"
    owner = "owner"
    throttled = True

    def __init__(self) -> None:
        self.claims = 0
        self.waits: list[bool] = []

    def waiting(self, for_slot: bool) -> None:
        self.waits.append(for_slot)

    def collectible(self) -> list[Item]:
        return []  # nothing of this run holds a slot

    def claim(self, item: Item) -> None:
        self.claims += 1
        return None

    def run(self, claim: Any) -> str:  # pragma: no cover - never claimed
        raise AssertionError("nothing was claimed")


def test_a_throttled_executor_probes_every_poll_interval_instead_of_spinning() -> None:
    items = [Item(n, f"k{n}", n, f"v{n}", 1, "p", n, "pending", 0, None) for n in range(1, 4)]
    job = _AlwaysThrottled()
    stop = threading.Event()
    timer = threading.Timer(1.0, stop.set)
    timer.start()
    thread_pool_executor(items, job, 8, stop, lambda item, result: None)  # type: ignore[arg-type]
    timer.cancel()
    assert job.claims <= 2 + 1.0 / THROTTLE_POLL_S  # one probe per interval, not thousands


def test_a_claim_handed_to_an_in_process_task_is_freed_as_unstarted_only_if_never_taken() -> None:
    """The flow hands claims to item tasks in its own process through memory (no write to
    consume the token). Freeing a claim whose task has taken it must not withdraw its
    intent (the task may be sending it): the claim comes back without its token. A claim
    freed before its task took it keeps its token (its intent is withdrawn), and the late
    task then finds nothing to take."""
    from episodic.core.records import ClaimAction
    from episodic.core.runs import Claim, Submission
    from episodic.tasks.process import PROCESS, LocalFlow, handed_claim

    item = Item(1, "k1", 1, "v1", 1, "p", 1, "running", 1, None)

    def claim(token: str) -> Claim:
        return Claim(
            item,
            "run",
            "flow",
            ClaimAction.SUBMIT,
            Submission(9, 1, 1, "k1-1", "intent", None),
            token,
        )

    local = LocalFlow(runner=None)  # type: ignore[arg-type]
    PROCESS.local_flows["flow"] = local
    try:
        local.handed[1] = claim("t1")
        assert handed_claim("flow", 1, "wrong token") is None
        taken = handed_claim("flow", 1, "t1")
        assert taken is not None and taken.token is None
        assert handed_claim("flow", 1, "t1") is None  # taken once
        assert local.unstarted(claim("t1")).token is None  # started: the intent stays

        local.handed[1] = claim("t2")
        freed = local.unstarted(claim("t2"))
        assert freed.token == "t2"  # never started: withdrawn with its token
        assert handed_claim("flow", 1, "t2") is None  # the late task takes nothing
        assert handed_claim("another flow", 1, "t2") is None
    finally:
        PROCESS.local_flows.pop("flow", None)


def test_a_throttled_executor_says_it_waits_for_a_provider_slot() -> None:
    """A run whose every slot is taken elsewhere does not stand still without a word: the
    executor tells its job when it starts waiting for a slot."""
    items = [Item(n, f"k{n}", n, f"v{n}", 1, "p", n, "pending", 0, None) for n in range(1, 3)]
    job = _AlwaysThrottled()
    stop = threading.Event()
    timer = threading.Timer(0.6, stop.set)
    timer.start()
    thread_pool_executor(items, job, 8, stop, lambda item, result: None)  # type: ignore[arg-type]
    timer.cancel()
    assert job.waits and job.waits[0] is True
