"""The thread-pool executor under a provider limit held elsewhere (no database)."""

from __future__ import annotations

import threading
from typing import Any

from core.runs import Item
from pipeline.engine import THROTTLE_POLL_S, thread_pool_executor


class _AlwaysThrottled:
    """Every slot is another run's: every claim is refused for a provider slot."""

    run_id = "run"
    owner = "owner"
    throttled = True

    def __init__(self) -> None:
        self.claims = 0

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
