"""Prefect tasks for paid items: the same engine step as the CLI, cached by idempotency key.

`generate_item` caches its result under ``generate-item:{idempotency key}`` with results
persisted in `result_storage` (EPISODIC_RESULT_STORAGE, else EPISODIC_HOME/results), so a
retried or re-created flow run skips an item that already finished without asking the
database or the provider. Only a completed item returns:
any other outcome raises, so it is never cached. Each paid step holds a slot of the
provider's global concurrency limit (strict: a missing limit is an error). Items are claimed
(`storage.claims`) before their task is created: an item held by another run is followed by
the engine, not run as a task that would fail.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from prefect import task
from prefect.concurrency.sync import concurrency as concurrency_slot
from prefect.context import TaskRunContext
from prefect.exceptions import ObjectNotFound
from prefect.filesystems import WritableFileSystem
from prefect.futures import PrefectFuture, as_completed

from core.errors import ProviderConfigError
from core.runs import Item
from core.settings import Settings, load_settings
from pipeline.engine import ItemJob
from providers.profiles import Profile

_jobs: dict[str, ItemJob] = {}
_guard = threading.Lock()


class ItemNotCompleted(Exception):
    """The item did not complete in this attempt (failed, unknown outcome, interrupted)."""


def provider_limit_name(profile_id: str) -> str:
    return f"episodic-provider-{profile_id}"


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
    owner: str, item_pk: int, item_id: str, idempotency_key: str, ledger_ref: str, profile: str
) -> dict[str, str]:
    """Work one item this process has already claimed (the claim is made before the task
    exists, so an item another run holds never shows up as a task here)."""
    with _guard:
        job = _jobs[owner]
    claim = job.take(item_pk)
    started = False
    try:
        with concurrency_slot(provider_limit_name(profile), occupy=1, strict=True):
            started = True
            outcome = job.run(claim)
    except BaseException:
        if not started:  # no slot (a missing limit, a cancel while waiting): nothing was sent
            job.abandon(claim, "not started: no provider slot")
        raise
    if outcome != "completed":
        raise ItemNotCompleted(f"item {item_id}: {outcome}")
    return {"item_id": item_id, "idempotency_key": idempotency_key, "outcome": outcome}


def result_storage(settings: Settings) -> str | Path:
    """Where item results (the cache that lets a retried flow skip finished items) live:
    the Prefect filesystem block named by EPISODIC_RESULT_STORAGE (a slug such as
    ``remote-file-system/shared-results``, for several machines), else the folder
    EPISODIC_HOME/results. Set on the task explicitly, so a worker's flow-run process (which
    imports Prefect before this project could set its defaults) uses it too."""
    return settings.result_storage or settings.results_path


def check_result_storage(settings: Settings) -> str:
    """Load the configured block now (a typo fails at setup, not in the middle of a run);
    returns a description of the storage. Raises `ProviderConfigError`."""
    if not settings.result_storage:
        return str(settings.results_path)
    from prefect.blocks.core import Block

    try:
        block = Block.load(settings.result_storage)
    except (ValueError, ObjectNotFound) as exc:
        raise ProviderConfigError(
            f"EPISODIC_RESULT_STORAGE: block {settings.result_storage!r} does not load: "
            f"{str(exc).splitlines()[0]}"
        ) from None
    if not isinstance(block, WritableFileSystem):
        raise ProviderConfigError(
            f"EPISODIC_RESULT_STORAGE: block {settings.result_storage!r} is not a writable "
            "filesystem block"
        )
    return settings.result_storage


def prefect_executor(
    items: Sequence[Item],
    job: ItemJob,
    concurrency: int,
    stop: threading.Event,
    progress: Callable[[Item, str], None],
    storage: str | Path | None = None,
) -> None:
    """Claims each item, then runs it as a `generate_item` task, `concurrency` at a time,
    with results in `storage` (default: `result_storage` of the current settings)."""
    profile = job.profile_id
    item_task = generate_item.with_options(
        result_storage=storage or result_storage(load_settings())
    )
    with _guard:
        _jobs[job.owner] = job
    queue = deque(items)
    running: dict[PrefectFuture[dict[str, str]], Item] = {}
    try:
        while queue or running:
            while queue and len(running) < concurrency and not stop.is_set():
                item = queue.popleft()
                if job.claim(item) is None:
                    continue
                future = item_task.submit(
                    job.owner, item.pk, item.item_id, item.idempotency_key, item.ledger_ref, profile
                )
                running[future] = item
            if not running:
                break
            future = next(as_completed(list(running)))  # refill as soon as any one finishes
            item = running.pop(future)
            progress(item, "completed" if future.state.is_completed() else "failed")
    finally:
        with _guard:
            _jobs.pop(job.owner, None)


class PrefectSecretCredentials:
    """Reads a profile's Prefect Secret block, or its environment variable."""

    def read(self, profile: Profile) -> str:
        if profile.credential_secret_block:
            from prefect.blocks.system import Secret

            from pipeline.gate import check_credential

            secret: Secret[str] = Secret.load(profile.credential_secret_block)  # type: ignore[assignment]
            return check_credential(
                profile, str(secret.get()), f"Secret block {profile.credential_secret_block!r}"
            )
        from pipeline.gate import EnvironmentCredentials

        return EnvironmentCredentials().read(profile)
