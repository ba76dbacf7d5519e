"""The scenarios of the fault suite, one module per fault family. Each scenario runs real
processes against a real database and returns a `Result` whose figures were counted in that
run: money from the provider's side (the fake provider's own log, the local HTTP server's
job count and bill), episodes from the database (`reliability.oracle`).
"""

from __future__ import annotations

import random
from collections.abc import Callable

from reliability.harness import Backend, Result
from reliability.scenarios.allocation import alloc_crash
from reliability.scenarios.budget import budget_kill_storm, budget_storm
from reliability.scenarios.database import pg_restart, pg_terminate, sqlite_locked
from reliability.scenarios.generation import flow_crash, generate_crash
from reliability.scenarios.provider import provider_faults
from reliability.scenarios.store import store_faults

SCENARIOS: dict[str, Callable[[Backend, int, random.Random], Result]] = {
    "alloc-crash": alloc_crash,
    "generate-crash": generate_crash,
    "flow-crash": flow_crash,
    "provider-faults": provider_faults,
    "budget-storm": budget_storm,
    "budget-kill-storm": budget_kill_storm,
    "store-faults": store_faults,
    "pg-terminate": pg_terminate,
    "pg-restart": pg_restart,
    "sqlite-locked": sqlite_locked,
}

ONLY_ON = {"pg-terminate": "postgres", "pg-restart": "postgres", "sqlite-locked": "sqlite"}

TRIALS = {
    "alloc-crash": 200,
    "generate-crash": 55,  # a few trials end before their signal (counted as "none")
    "flow-crash": 55,
    "provider-faults": 50,
    "budget-storm": 12,  # 2-20 s a trial (eight processes at most)
    "budget-kill-storm": 6,  # 30-120 s a trial (eight generates, then a resume of each run)
    "store-faults": 12,  # about 8 s a trial: a freeze lasts 3-5 s
    "pg-terminate": 3,
    "pg-restart": 3,
    "sqlite-locked": 2,
}
