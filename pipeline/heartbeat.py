"""The heartbeat: one process's lease renewal on a run, and what a renewal's answer means.

Every third of the lease the heartbeat renews this process's claims and the run's lease in
one call (`LeaseStore.renew`), which answers with the run's state:

- running: go on;
- failed (another process concluded it) or paused (another process's interrupt) while this
  process still works on it: the run is reopened here (only a cancel, or a pause at a media
  store failure, stops every process); a process that is stopping itself leaves the run as
  it is;
- anything else (paused, cancelled, completed): this process stops at its next item.

A renewal that fails (a database hiccup) is tried again at the next beat: every write of the
run is guarded, so a late renewal risks a lease expiring, never a second payment.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from episodic.core.states import RunState

if TYPE_CHECKING:
    from episodic.pipeline.runner import Runner

REOPENED = (RunState.FAILED, RunState.PAUSED)
"""States a renewal may find the run in while this process still works: it reopens it."""


class Heartbeat(threading.Thread):
    """Renews the owner's leases and stops the run's work when the run stops running."""

    def __init__(
        self, runner: Runner, owner: str, run_id: str, lease_s: float, stop: threading.Event
    ) -> None:
        super().__init__(name=f"heartbeat-{run_id[:8]}", daemon=True)
        self.runner, self.owner, self.run_id, self.lease_s = runner, owner, run_id, lease_s
        self.stop_work = stop
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(max(0.2, self.lease_s / 3)):
            try:
                state = self.runner.leases.renew(self.owner, self.run_id, self.lease_s)
                if state in REOPENED and not self.stop_work.is_set():
                    state = self.runner.reopen(self.run_id, self.lease_s)
            except Exception:  # a database hiccup: try again; guarded writes stay safe
                continue
            if state != RunState.RUNNING:  # paused, cancelled or completed: stop here
                self.stop_work.set()
