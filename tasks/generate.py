"""`generate-item`: the Prefect task of one paid item, the same runner step as the CLI,
cached by idempotency key.

`generate_item` caches its result under ``generate-item-{sha256 of "{idempotency key}:{ledger
row}@{installation id}"}`` with results persisted in `episodic.tasks.results.result_storage`
(EPISODIC_RESULT_STORAGE, else a remote media store's block, else EPISODIC_HOME/results),
so a retried or re-created flow run skips an item that already finished without asking the
database or the provider. Only a completed item returns: any other outcome raises, so it is
never cached.

Items run anywhere. The flow claims each item (`episodic.storage.claims`) before its task exists (an
item held by another run is followed by the runner, not run as a task that would fail), and
the task carries only ids: it rebuilds the claim and its runner from the database and the
environment (EPISODIC_DATABASE_URL, the provider profile, its credential; `episodic.tasks.process`),
so it runs the same in the flow's threads, on a Dask worker, or on another machine. The
provider's limit of items in flight is part of the claim (a slot is a running item with a
live lease, counted per profile across every run and process), so no Prefect concurrency
slot is taken per item.
"""

from __future__ import annotations

import hashlib
from typing import Any

from prefect import task
from prefect.context import TaskRunContext
from prefect.states import Cancelled

from episodic.core.planning import RunOptions
from episodic.core.records import ClaimAction, ItemResult
from episodic.core.runs import Item
from episodic.tasks.process import ItemNotCompleted, handed_claim, item_runner, item_worked


def item_cache_key(context: TaskRunContext, parameters: dict[str, Any]) -> str:
    """Task name + the item's idempotency key (never the bare INPUTS policy).

    The ledger row (pk and creation time) is part of it too: two databases that share one
    result store (staging and production on one Prefect server, a test database per test)
    must never read each other's "already done".

    The key is also the result's storage path, so it is hashed to ``{task name}-{64 hex}``:
    Prefect's `RemoteFileSystem` (the media store's result block) reads a key that starts
    ``generate-item:`` as a URL scheme and refuses it, and a ledger row's time has colons.
    """
    identity = f"{parameters['idempotency_key']}:{parameters['ledger_ref']}"
    return f"{context.task.name}-{hashlib.sha256(identity.encode()).hexdigest()}"


def ledger_ref(installation: str, item: Item) -> str:
    """The item's row in this installation's database, as the cache key carries it: the
    installation id (databases that share a result store never meet, whatever their rows'
    numbers and times) and the row itself (test databases cloned from one template share
    an installation id)."""
    return f"{item.ledger_ref}@{installation}"


@task(
    name="generate-item",
    cache_key_fn=item_cache_key,
    persist_result=True,
    retries=0,
    task_run_name="item {item_id}",
)
def generate_item(work: dict[str, Any], item_id: str, idempotency_key: str, ledger_ref: str) -> str:
    """Work one item the flow has claimed, wherever this task runs; returns the item's
    idempotency key (the cached result: the item is done).

    `work` holds ids only: ``{pipeline, episode_id, run_id, owner, item_pk, action,
    submission_pk, token, profile, options, cap_micros}`` (options as `RunOptions.params()`,
    `cap_micros` the per-run cap of the run's request); the claim's token is consumed when
    the task starts, so a second execution of the same task sends nothing.
    Raises `ItemNotCompleted` when the item did not complete (the claim was lost, the call
    failed, or its acceptance is unknown: it is reconciled later, never resubmitted).
    """
    runner = item_runner(
        work["pipeline"], work["episode_id"], work.get("profile"), work.get("owner")
    )
    claim = handed_claim(work["owner"], work["item_pk"], work["token"]) or (
        runner.leases.load_claim(
            work["item_pk"],
            work["run_id"],
            work["owner"],
            ClaimAction(work["action"]),  # the value, as the parameter carries it
            work["submission_pk"],
            work["token"],
        )
    )
    if claim is None:  # cancelled, paused or taken over since the flow claimed it
        raise ItemNotCompleted(f"item {item_id}: no longer held by this run")
    outcome = None
    try:
        options = RunOptions.from_params(work["options"], work.get("cap_micros"))
        outcome = runner.process(claim, options)
    finally:  # the claim is completed or released by now: its slot is free
        item_worked(work["owner"], work["item_pk"], outcome)
    if outcome == ItemResult.INTERRUPTED:  # the run was stopped (a cancel, Ctrl-C, a pause):
        # no error, so no traceback in the run's log; the flow reads the state, not the result
        return Cancelled(  # type: ignore[return-value]
            message=f"item {item_id}: interrupted (the run stopped before it finished; "
            "an accepted job keeps its reference)"
        )
    if outcome != ItemResult.COMPLETED:
        raise ItemNotCompleted(f"item {item_id}: {outcome}")
    # A string, not a collection: Prefect visits a task's result to link it to its state (a
    # dict of three cost a seventh of an item task's interpreter time, bench/batch.py).
    return idempotency_key
