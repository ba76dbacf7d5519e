"""The Prefect flow's executor: each claimed item runs as a `generate_item` task."""

from __future__ import annotations

import queue as queues
import threading
from collections import deque
from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any, cast

from prefect.context import FlowRunContext
from prefect.futures import PrefectFuture
from prefect.task_runners import ThreadPoolTaskRunner
from prefect.utilities.annotations import quote

from core.planning import RunOptions
from core.records import ItemResult
from core.runs import Claim, Item
from core.settings import load_settings
from pipeline.executors import THROTTLE_POLL_S, ItemJob, Progress, claim_next, collect_first
from tasks.generate import generate_item, ledger_ref
from tasks.process import PROCESS, LocalFlow
from tasks.results import load_result_storage, result_storage


def prefect_executor(
    items: Sequence[Item],
    job: ItemJob,
    concurrency: int,
    stop: threading.Event,
    progress: Progress,
    storage: str | Path | None = None,
    *,
    pipeline: str,
    episode_id: str,
    options: RunOptions,
) -> None:
    """Claims each item, then runs it as a `generate_item` task, `concurrency` at a time,
    with results in `storage` (default: `result_storage` of the current settings), on the
    flow's task runner (threads, or Dask workers anywhere)."""
    context = FlowRunContext.get()
    in_process = context is not None and isinstance(context.task_runner, ThreadPoolTaskRunner)
    storage = storage or result_storage(load_settings())
    scope = job.runner.claims.installation()
    item_task = generate_item.with_options(
        # Prefect resolves a task's result storage at the start of every task run: a block
        # slug (EPISODIC_RESULT_STORAGE) was an API call per item. In this process the block
        # is loaded once per run; Dask workers load it themselves (the loaded block, with
        # whatever credentials it holds, is never pickled onto the cluster). A folder stays
        # a path: Prefect takes only saved blocks, and a path costs no call.
        result_storage=(
            load_result_storage(storage) if in_process and isinstance(storage, str) else storage
        ),
        # Write the result under the item's cache key, without looking it up first: an item
        # is dispatched only when its claim found it not completed, so the lookup can only
        # miss (it cost a quarter of Prefect's time per task run, bench/batch.py). A flow run
        # that asks for a finished item by the task itself still gets the cached result.
        refresh_cache=True,
    )
    params = options.params()
    queue = deque(items)
    running: dict[PrefectFuture[str], tuple[Item, Claim]] = {}
    worked: set[int] = set()  # items in `running` whose work is over (their task finishing)
    local = LocalFlow(job.runner)
    events = local.events
    with PROCESS.guard:
        PROCESS.local_flows[job.owner] = local
    try:
        while queue or running:
            room = concurrency - len(running) + len(worked)
            claimed, throttled = claim_next(queue, job, stop, room)
            for item, claim in claimed:
                local.hand(job.take(item.pk))  # the task works it by ids (from here, or
                work = {  # from the database)
                    "pipeline": pipeline,
                    "episode_id": episode_id,
                    "run_id": job.run_id,
                    "owner": job.owner,
                    "item_pk": item.pk,
                    "action": claim.action,
                    "submission_pk": claim.submission.pk if claim.submission else None,
                    "token": claim.token,
                    "profile": job.profile_id,
                    "options": params,
                    "cap_minor": options.cap_minor,
                }
                # On the thread runner, Prefect need not search `work` for futures (ids only;
                # the search cost a tenth of an item task's time). Dask receives it as sent.
                future = item_task.submit(
                    cast(Any, quote(work)) if in_process else work,
                    item.item_id,
                    item.idempotency_key,
                    ledger_ref(scope, item),
                )
                running[future] = (item, claim)
                future.add_done_callback(lambda done: events.put(("finished", done)))
            # Slots held by the run's own accepted jobs that nobody collects (a killed or
            # interrupted process's, one left for later): collected first, before any wait
            # (a task still finishing keeps its item until it has: `running`).
            ours = {item.pk for item, _ in running.values()}
            if throttled and not stop.is_set() and collect_first(queue, job, ours):
                continue
            if not running:
                if stop.is_set() or not queue:
                    break
                if throttled:  # every slot is another run's: wait for one
                    job.waiting(True)
                    stop.wait(THROTTLE_POLL_S)
                continue  # the batch was busy or done elsewhere: claim the next ones
            # Wait for one item's work to end (its slot is free) or one task to finish, then
            # take every other event that came meanwhile: one claim fills all free slots.
            pending = [events.get()]
            while True:
                try:
                    pending.append(events.get_nowait())
                except queues.Empty:
                    break
            for kind, what in pending:
                if kind == "worked":
                    pk, _outcome = what
                    if any(item.pk == pk for item, _ in running.values()):
                        worked.add(pk)
                    continue
                if what not in running:
                    continue
                item, claim = running.pop(what)
                worked.discard(item.pk)
                what.wait()  # the final state from the finished future, not an API read
                completed = what.state.is_completed()
                if not completed:  # the task ended early (lost worker): free its claim;
                    job.release(local.unstarted(claim))  # an intent it may have sent is
                    # reconciled, never resent
                job.waiting(False)
                progress(item, ItemResult.COMPLETED if completed else ItemResult.FAILED)
    except BaseException:  # the runner pauses the run and releases this owner's claims
        stop.set()
        # Claims handed to tasks that never loaded them (queued on a busy Dask cluster) sent
        # nothing: their intents are withdrawn now, so the next run submits those items
        # instead of leaving them "acceptance unknown" (`release_unstarted` takes the token,
        # so a task that starts late sends nothing either).
        for _item, claim in list(running.values()):
            with suppress(Exception):
                job.release(local.unstarted(claim))
        raise
    finally:
        with PROCESS.guard:
            PROCESS.local_flows.pop(job.owner, None)
