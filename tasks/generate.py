"""Prefect tasks for paid items: the same engine step as the CLI, cached by idempotency key.

`generate_item` caches its result under ``generate-item:{idempotency key}`` with results
persisted (EPISODIC_HOME/results), so a retried or re-created flow run skips an item that
already finished without asking the database or the provider. Only a completed item returns:
any other outcome raises, so it is never cached. Each paid step holds a slot of the
provider's global concurrency limit (strict: a missing limit is an error).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from prefect import task
from prefect.concurrency.sync import concurrency as concurrency_slot
from prefect.context import TaskRunContext
from prefect.futures import PrefectFuture, as_completed

from core.runs import Item
from pipeline.runs import RunEngine, RunOptions
from providers.profiles import Profile

_engines: dict[str, tuple[RunEngine, RunOptions]] = {}
_guard = threading.Lock()


class ItemNotCompleted(Exception):
    """The item did not complete in this attempt (failed, unknown outcome, interrupted)."""


def provider_limit_name(profile_id: str) -> str:
    return f"episodic-provider-{profile_id}"


def register(run_id: str, engine: RunEngine, options: RunOptions) -> None:
    with _guard:
        _engines[run_id] = (engine, options)


def unregister(run_id: str) -> None:
    with _guard:
        _engines.pop(run_id, None)


def item_cache_key(context: TaskRunContext, parameters: dict[str, Any]) -> str:
    """Task name + the item's idempotency key (never the bare INPUTS policy).

    The ledger row (pk and creation time) is part of it too: two databases that share one
    result store (staging and production on one Prefect server, a test database per test)
    must never read each other's "already done".
    """
    return f"{context.task.name}:{parameters['idempotency_key']}:{parameters['ledger_ref']}"


@task(
    name="generate-item",
    cache_key_fn=item_cache_key,
    persist_result=True,
    retries=0,
    task_run_name="item {item_id}",
)
def generate_item(
    run_id: str, item_pk: int, item_id: str, idempotency_key: str, ledger_ref: str
) -> dict[str, str]:
    with _guard:
        engine, options = _engines[run_id]
    item = engine.store.get_item(item_pk)
    with concurrency_slot(provider_limit_name(engine.profile.id), occupy=1, strict=True):
        outcome = engine.process(run_id, item, options)
    if outcome != "completed":
        raise ItemNotCompleted(f"item {item_id}: {outcome}")
    return {"item_id": item_id, "idempotency_key": idempotency_key, "outcome": outcome}


def prefect_executor(
    items: Sequence[Item],
    work: Callable[[Item], str],
    concurrency: int,
    stop: threading.Event,
    progress: Callable[[Item, str], None],
) -> None:
    """Runs each item as a `generate_item` task, at most `concurrency` at a time."""
    run_id = _run_of(work)
    queue = list(items)
    running: dict[PrefectFuture[dict[str, str]], Item] = {}
    while queue or running:
        while queue and len(running) < concurrency and not stop.is_set():
            item = queue.pop(0)
            future = generate_item.submit(
                run_id, item.pk, item.item_id, item.idempotency_key, item.ledger_ref
            )
            running[future] = item
        if not running:
            break
        future = next(as_completed(list(running)))  # refill as soon as any one finishes
        item = running.pop(future)
        progress(item, "completed" if future.state.is_completed() else "failed")


def _run_of(work: Callable[[Item], str]) -> str:
    run_id = getattr(work, "run_id", None)
    if not isinstance(run_id, str):
        raise TypeError("the item work function carries no run_id")
    return run_id


class PrefectSecretCredentials:
    """Reads a profile's Prefect Secret block, or its environment variable."""

    def read(self, profile: Profile) -> str:
        if profile.credential_secret_block:
            from prefect.blocks.system import Secret

            secret: Secret[str] = Secret.load(profile.credential_secret_block)  # type: ignore[assignment]
            return str(secret.get())
        from pipeline.gate import EnvironmentCredentials

        return EnvironmentCredentials().read(profile)
