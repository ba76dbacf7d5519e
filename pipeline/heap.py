"""A run keeps the process's long-lived objects out of the garbage collector's full passes.

CPython's cyclic collector walks every tracked object of the generation it collects; a full
(generation 2) collection walks the whole heap. In the Prefect flow's process (Prefect,
SQLAlchemy, pydantic, Pillow and this project loaded) one full collection took 0.28-0.54 s
in the middle of a 200-item run, and it stops every thread while it runs: every item's
completion, the dispatcher's claims and Prefect's task engine (bench/batch.py: the largest
gap between two items' endings, at concurrency 8, was that collection to the millisecond).
With Prefect's flow-run heartbeat on, a flow run ends at a whole second after its start
(Prefect's heartbeat thread sleeps in 1 s steps and the flow run joins it), so those 0.5 s
moved some runs a whole second later: the bench's bimodal makespans.

`freeze_for_run` moves every object alive when a run starts (the imported modules, the
clients, the settings) into the collector's permanent generation (`gc.freeze`) for the
run's duration, and `thaw_after_run` moves them back into the oldest generation when the
last run of the process ends (`gc.unfreeze`): the collections during the run walk only what
the run itself allocated, and nothing is kept from collection after it. Runs of one process
share one freeze (a counter); a freeze someone else made (a pre-fork server's) is left as it
is. No behaviour depends on it: it changes only when garbage is found, never whether.
"""

from __future__ import annotations

import gc
import threading

_guard = threading.Lock()
_runs = 0  # runs of this process between `freeze_for_run` and `thaw_after_run`
_ours = False  # whether the current freeze is this module's (unfrozen by the last run)


def freeze_for_run() -> None:
    """A run starts working its items (see the module docstring); pair with `thaw_after_run`."""
    global _runs, _ours
    with _guard:
        _runs += 1
        if _runs == 1 and gc.get_freeze_count() == 0:
            gc.freeze()
            _ours = True


def thaw_after_run() -> None:
    """A run's items are done: the last run of the process gives the objects back."""
    global _runs, _ours
    with _guard:
        _runs = max(0, _runs - 1)
        if _runs == 0 and _ours:
            gc.unfreeze()
            _ours = False
