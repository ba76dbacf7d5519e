"""Provider faults: the local HTTP provider server with every fault mode mixed at random."""

from __future__ import annotations

import os
import random
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from reliability.harness import Backend, Result, generate_trial, open_engine
from reliability.oracle import episode_cost, episode_of, leftovers, unfinished_items

_FAULTS = [
    "[[CREATED_502]]",
    "[[CREATED_504]]",
    "[[CREATED_409]]",
    "[[CREATED_422_IDEMPOTENCY]]",
    "[[MALFORMED_CREATE]]",
    "[[ACCEPT_DROP]]",
    "[[SLOW_MS:1200]]",
    "[[HTTP_429:2]]",
    "[[HTTP_500]]",
    "[[POLL_QUEUED:3]]",
    "[[POLL_401]]",
    "[[POLL_500:2]]",
    "[[POLL_BADJSON]]",
    "[[DOWNLOAD_404:2]]",
]


def provider_faults(backend: Backend, trials: int, rng: random.Random) -> Result:
    """Runs against the local HTTP provider server with every fault mode mixed at random
    (several per item), a provider that honours idempotency keys or only lookups, a list
    that ignores its filter in some runs: one job per item, and the ledger's cost equals the
    server's bill."""
    from tests.http_server import TOKEN, PredictionsServer

    result = Result("provider-faults", backend.name)
    url = backend.fresh()
    engine = open_engine(url)
    root = Path(tempfile.mkdtemp(prefix="episodic-reliability-http-"))
    saved = {k: os.environ.get(k) for k in ("EPISODIC_PROVIDERS_FILE", "TEST_IMAGE_TOKEN")}
    os.environ["TEST_IMAGE_TOKEN"] = TOKEN
    paid = items_total = operator = made_anyway = 0
    try:
        for trial in range(trials):
            honour = rng.random() < 0.5
            ignores_filter = rng.random() < 0.25
            with PredictionsServer(
                honour_idempotency=honour, list_ignores_filter=ignores_filter
            ) as server:
                profiles = root / f"providers{trial}.yaml"
                profiles.write_text(
                    f"profiles:\n  http-t{trial}:\n    kind: http\n"
                    f"    base_url: {server.base_url}\n    credential_env: TEST_IMAGE_TOKEN\n"
                    "    cost_per_image_minor: 5\n    max_concurrency: 4\n    timeout_s: 1\n"
                    f"    poll_interval_s: 0.05\n    idempotent_create: {str(honour).lower()}\n"
                    "    lookup: true\n"
                )
                os.environ["EPISODIC_PROVIDERS_FILE"] = str(profiles)
                count = rng.randint(3, 6)
                titles = []
                for n in range(count):
                    faults = rng.sample(_FAULTS, rng.randint(0, 2))
                    result.faults.update(f.strip("[]").split(":")[0] for f in faults)
                    titles.append(f"t{trial} i{n} {' '.join(faults)}".strip())
                outcome = _generate_http(engine, root / f"pl{trial}", trial, titles)
                if outcome.state.value != "completed":  # a resume settles what is left
                    outcome = _generate_http(engine, None, trial, titles)
                made = server.jobs_made
                paid += sum(made.values())
                items_total += count
                result.trials += 1
                left = unfinished_items(engine, f"http-{trial}")
                # an Idempotency-Key is {installation}-{item key}-{attempt}
                per_item = Counter(key.rsplit("-", 2)[-2] for key in made.elements())
                for prompt, error, key in left:
                    if not honour and (error or "").startswith("acceptance unknown"):
                        operator += 1  # as designed: a lookup that finds nothing proves nothing
                        made_anyway += 1 if per_item.get(key) else 0
                    else:
                        result.problem(f"run {trial}: {prompt!r} not completed: {error}")
                _, stuck, lost = leftovers(
                    engine, episode_of(engine, f"http-{trial}"), unknown_is_stuck=honour
                )
                result.stuck = (result.stuck or 0) + stuck
                result.lost += lost
                if any(n > 1 for n in per_item.values()):  # per item: any attempt, any key
                    result.problem(f"run {trial}: a second job was made: {dict(made)}")
                if len(made) < count - len(left):
                    result.problem(f"run {trial}: a completed item has no job of its own")
                cost = episode_cost(engine, f"http-{trial}")
                if cost != server.bill_micros:
                    result.problem(
                        f"run {trial}: ledger {cost} != provider bill {server.bill_micros}"
                    )
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    result.paid_jobs, result.logical_items = paid, items_total
    result.notes = (
        "3-6 items per run, 0-2 fault modes per item; idempotent create or lookup only at "
        "random; a quarter of the runs with a list that ignores its filter; each run resumed "
        f"once if it did not complete. {operator} items were left 'acceptance unknown' for an "
        "operator, as designed: their provider offers no idempotent create and its lookup "
        "found no job, which does not prove that none was made (the server had made a job "
        f"for {made_anyway} of them: an operator's --force-resubmit would pay those twice)"
    )
    engine.dispose()
    return result


def _generate_http(engine: Engine, folder: Path | None, trial: int, titles: list[str]) -> Any:
    return generate_trial(
        engine, folder, trial, titles, week="2026-W32", prefix="http", concurrency=4
    )
