"""The Prefect flow's executor: each claimed item runs as a `generate_item` task (the lanes
of `episodic.pipeline.item_dispatch.dispatch`)."""

from __future__ import annotations

import queue as queues
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from prefect.context import FlowRunContext
from prefect.futures import PrefectFuture
from prefect.task_runners import ThreadPoolTaskRunner
from prefect.utilities.annotations import quote

from episodic.core.planning import RunOptions
from episodic.core.records import ItemResult
from episodic.core.runs import Claim, Item
from episodic.core.settings import load_settings
from episodic.pipeline.item_dispatch import Answer, ClaimSide, Progress, claim_next, dispatch
from episodic.tasks.generate import generate_item, ledger_ref
from episodic.tasks.process import PROCESS, LocalFlow
from episodic.tasks.results import load_result_storage, result_storage


def prefect_executor(
    items: Sequence[Item],
    claims: ClaimSide,
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
    flow's task runner (threads, or Dask workers anywhere): the one dispatch machine
    (`episodic.pipeline.item_dispatch.dispatch`) driving `_TaskLanes`."""
    context = FlowRunContext.get()
    in_process = context is not None and isinstance(context.task_runner, ThreadPoolTaskRunner)
    storage = storage or result_storage(load_settings())
    scope = claims.runner.claims.installation()
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
    local = LocalFlow(claims.runner)
    lanes = _TaskLanes(
        claims, stop, local, item_task, in_process, scope, options, pipeline, episode_id
    )
    with PROCESS.guard:
        PROCESS.local_flows[claims.owner] = local
    try:
        dispatch(items, claims, lanes, concurrency, stop, progress)
    finally:
        with PROCESS.guard:
            PROCESS.local_flows.pop(claims.owner, None)


@dataclass
class _TaskLanes:
    """Claims in batches (`claim_next`: one transaction fills every free slot), each claimed
    item submitted as an item task; the endings come as events: a done callback's
    'finished', and a task's 'worked' (`item_worked`) the moment the item's work is over,
    which frees its slot while Prefect still finishes the task run."""

    batched = True

    claims: ClaimSide
    stop: threading.Event
    local: LocalFlow
    item_task: Any  # `generate_item` with this run's options
    in_process: bool  # the flow's own thread runner (else Dask workers)
    scope: str  # the installation, for `ledger_ref`
    options: RunOptions
    pipeline: str
    episode_id: str
    running: dict[PrefectFuture[str], tuple[Item, Claim]] = field(default_factory=dict)
    worked: set[int] = field(default_factory=set)  # items in `running` whose work is over
    params: dict[str, Any] = field(init=False)  # the options as each item task receives them

    def __post_init__(self) -> None:
        self.params = self.options.params()

    @property
    def in_flight(self) -> int:
        return len(self.running)

    @property
    def busy(self) -> int:
        return len(self.running) - len(self.worked)

    def holding(self) -> set[int]:
        # A task still finishing keeps its item until it has: `running`.
        return {item.pk for item, _ in self.running.values()}

    def start(self, queue: deque[Item], room: int) -> bool:
        claims, events = self.claims, self.local.events
        claimed, throttled = claim_next(queue, claims, self.stop, room)
        for item, claim in claimed:
            self.local.hand(claims.take(item.pk))  # the task works it by ids (from here, or
            work = {  # from the database)
                "pipeline": self.pipeline,
                "episode_id": self.episode_id,
                "run_id": claims.run_id,
                "owner": claims.owner,
                "item_pk": item.pk,
                "action": claim.action,
                "submission_pk": claim.submission.pk if claim.submission else None,
                "token": claim.token,
                "profile": claims.profile_id,
                "options": self.params,
                "cap_micros": self.options.cap_micros,
            }
            # On the thread runner, Prefect need not search `work` for futures (ids only;
            # the search cost a tenth of an item task's time). Dask receives it as sent.
            future = self.item_task.submit(
                cast(Any, quote(work)) if self.in_process else work,
                item.item_id,
                item.idempotency_key,
                ledger_ref(self.scope, item),
            )
            self.running[future] = (item, claim)
            future.add_done_callback(lambda done: events.put(("finished", done)))
        return throttled

    def endings(self) -> Iterator[tuple[Item, Answer]]:
        # Wait for one item's work to end (its slot is free) or one task to finish, then
        # take every other event that came meanwhile: one claim fills all free slots.
        events = self.local.events
        pending = [events.get()]
        while True:
            try:
                pending.append(events.get_nowait())
            except queues.Empty:
                break
        for kind, what in pending:
            if kind == "worked":
                pk, outcome = what
                if outcome in (ItemResult.NOT_STORED, ItemResult.THROTTLED):
                    self.stop.set()  # the run is paused: claim no more
                if any(item.pk == pk for item, _ in self.running.values()):
                    self.worked.add(pk)
                continue
            if what not in self.running:
                continue
            item, claim = self.running.pop(what)
            self.worked.discard(item.pk)
            what.wait()  # the final state from the finished future, not an API read
            completed = what.state.is_completed()
            if not completed:  # the task ended early (lost worker): free its claim; an
                self.claims.release(self.local.unstarted(claim))  # intent it may have sent
                # is reconciled, never resent
            yield item, ItemResult.COMPLETED if completed else ItemResult.FAILED

    def abandon(self) -> None:
        # The runner pauses the run and releases this owner's claims. Claims handed to tasks
        # that never loaded them (queued on a busy Dask cluster) sent nothing: their intents
        # are withdrawn now, so the next run submits those items instead of leaving them
        # "acceptance unknown" (`release_unstarted` takes the token, so a task that starts
        # late sends nothing either).
        for _item, claim in list(self.running.values()):
            with suppress(Exception):
                self.claims.release(self.local.unstarted(claim))
