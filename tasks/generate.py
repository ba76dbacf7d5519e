"""Prefect tasks for paid items: the same engine step as the CLI, cached by idempotency key.

`generate_item` caches its result under ``generate-item:{idempotency key}:{ledger row}@{installation
id}`` with results persisted in `result_storage` (EPISODIC_RESULT_STORAGE, else
EPISODIC_HOME/results), so a retried or re-created flow run skips an item that already
finished without asking the database or the provider. Only a completed item returns: any
other outcome raises, so it is never cached.

Items run anywhere. The flow claims each item (`storage.claims`) before its task exists (an
item held by another run is followed by the engine, not run as a task that would fail), and
the task carries only ids: it rebuilds the claim and its engine from the database and the
environment (EPISODIC_DATABASE_URL, the provider profile, its credential), so it runs the same
in the flow's threads, on a Dask worker, or on another machine. The provider's limit of items
in flight is part of the claim (a slot is a running item with a live lease, counted per
profile across every run and process), so no Prefect concurrency slot is taken per item.
"""

from __future__ import annotations

import os
import queue as queues
import threading
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

from prefect import task
from prefect.context import FlowRunContext, TaskRunContext
from prefect.exceptions import ObjectNotFound
from prefect.filesystems import WritableFileSystem
from prefect.futures import PrefectFuture
from prefect.states import Cancelled
from prefect.task_runners import ThreadPoolTaskRunner
from prefect.utilities.annotations import quote

from core.errors import ProviderConfigError
from core.runs import INTERRUPTED, Claim, Item
from core.settings import Settings, load_settings
from pipeline.engine import (
    THROTTLE_POLL_S,
    ItemJob,
    RunEngine,
    claim_next,
    collect_first,
)
from pipeline.runs import RunOptions
from providers.profiles import Profile

_engines: dict[tuple[str, str, str], RunEngine] = {}  # a cache rebuilt from ids, per process
_guard = threading.Lock()
_building = threading.Lock()


@dataclass
class _LocalFlow:
    """A flow dispatching in this process, found by its claim owner by the item tasks that
    run here (the thread runner); a task elsewhere (Dask) finds none and works from the
    database alone.

    - `events`: a task tells its dispatcher the moment the item's work is over, so the next
      item is claimed while Prefect still finishes the task run;
    - `engine`: the flow's engine, shared instead of built per process (it also carries the
      flow's stop event, so an interrupted flow stops its tasks' work);
    - `handed`: the claims handed to tasks not yet started. A task takes its claim here
      instead of consuming the claim's token in the database (one write transaction less
      per item); the dispatcher frees a claim as unstarted (withdrawing its intent) only if
      it is still here, under the same lock, so a started task's intent is never withdrawn.
    """

    engine: RunEngine
    events: queues.SimpleQueue[tuple[str, Any]] = field(default_factory=queues.SimpleQueue)
    handed: dict[int, Claim] = field(default_factory=dict)

    def take(self, item_pk: int, token: str | None) -> Claim | None:
        with _guard:
            claim = self.handed.get(item_pk)
            if claim is None or claim.token != token:
                return None
            del self.handed[item_pk]
        return replace(claim, token=None)  # consumed: its task has started

    def unstarted(self, claim: Claim) -> Claim:
        """`claim` as the dispatcher may free it: with its token if its task never took it
        (its intent is withdrawn), without if the task started (its intent stays open)."""
        with _guard:
            if self.handed.pop(claim.item.pk, None) is not None:
                return claim
        return replace(claim, token=None)


_local_flows: dict[str, _LocalFlow] = {}


class ItemNotCompleted(Exception):
    """The item did not complete in this attempt (failed, unknown outcome, interrupted)."""


def item_cache_key(context: TaskRunContext, parameters: dict[str, Any]) -> str:
    """Task name + the item's idempotency key (never the bare INPUTS policy).

    The ledger row (pk and creation time) is part of it too: two databases that share one
    result store (staging and production on one Prefect server, a test database per test)
    must never read each other's "already done".
    """
    return f"{context.task.name}:{parameters['idempotency_key']}:{parameters['ledger_ref']}"


def ledger_ref(installation: str, item: Item) -> str:
    """The item's row in this installation's database, as the cache key carries it: the
    installation id (databases that share a result store never meet, whatever their rows'
    numbers and times) and the row itself (test databases cloned from one template share
    an installation id)."""
    return f"{item.ledger_ref}@{installation}"


def item_engine(
    pipeline: str, episode_id: str, profile: str | None = None, owner: str | None = None
) -> RunEngine:
    """This process's engine for the episode: the flow's own engine when the task runs in
    the flow's process (found by the claim's `owner`; it also carries the flow's stop event),
    else one built from the environment on first use: the gate, the recorded plan's provider
    profile and a provider with its credential.

    `profile` is the provider profile the claim was made under: an engine cached for another
    profile (the episode was re-planned onto another provider while this worker lived) is
    rebuilt from the current plan, and a claim made under a profile that is no longer the
    plan's raises `ItemNotCompleted` (its intent names a provider this plan no longer uses).
    """
    from pipeline.generation import prepare, run_engine
    from storage.registry import engine_for

    with _guard:
        local = _local_flows.get(owner) if owner is not None else None
    if local is not None and profile in (None, local.engine.profile.id):
        return local.engine
    settings = _settings()
    key = (settings.url, pipeline, episode_id)
    with _guard:
        cached = _engines.get(key)
    if cached is not None and profile in (None, cached.profile.id):
        return cached
    with _building:  # one build per process: the other tasks wait and take it
        with _guard:
            current = _engines.get(key)
        if current is not None and current is not cached and profile in (None, current.profile.id):
            return current
        db = engine_for(settings)
        built = run_engine(
            db,
            settings,
            prepare(db, settings, pipeline, episode_id, "generate"),
            PrefectSecretCredentials(),
        )
        if profile is not None and built.profile.id != profile:
            raise ItemNotCompleted(
                f"episode {episode_id}: claimed under provider profile {profile!r}, but its "
                f"plan now uses {built.profile.id!r}"
            )
        with _guard:
            _engines[key] = built
        return built


_settings_by_env: dict[tuple[tuple[str, str], ...], Settings] = {}


def _settings() -> Settings:
    """`load_settings()`, read again only when an ``EPISODIC_*`` variable changed (building
    the settings object per item cost a tenth of an item task's time, bench/batch.py)."""
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("EPISODIC_")))
    with _guard:
        cached = _settings_by_env.get(env)
    if cached is None:
        cached = load_settings()
        with _guard:
            _settings_by_env.clear()
            _settings_by_env[env] = cached
    return cached


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
    submission_pk, token, profile, options}`` (options as `RunOptions.params()`); the
    claim's token is consumed when the task starts, so a second execution of the same task
    sends nothing.
    Raises `ItemNotCompleted` when the item did not complete (the claim was lost, the call
    failed, or its acceptance is unknown: it is reconciled later, never resubmitted).
    """
    engine = item_engine(
        work["pipeline"], work["episode_id"], work.get("profile"), work.get("owner")
    )
    claim = handed_claim(work["owner"], work["item_pk"], work["token"]) or (
        engine.leases.load_claim(
            work["item_pk"],
            work["run_id"],
            work["owner"],
            work["action"],
            work["submission_pk"],
            work["token"],
        )
    )
    if claim is None:  # cancelled, paused or taken over since the flow claimed it
        raise ItemNotCompleted(f"item {item_id}: no longer held by this run")
    outcome = "error"
    try:
        outcome = engine.process(claim, RunOptions.from_params(work["options"]))
    finally:  # the claim is completed or released by now: its slot is free
        item_worked(work["owner"], work["item_pk"], outcome)
    if outcome == INTERRUPTED:  # the run was stopped (a cancel, Ctrl-C, a pause): no error,
        # so no traceback in the run's log; the flow reads the state, not the result
        return Cancelled(  # type: ignore[return-value]
            message=f"item {item_id}: interrupted (the run stopped before it finished; "
            "an accepted job keeps its reference)"
        )
    if outcome != "completed":
        raise ItemNotCompleted(f"item {item_id}: {outcome}")
    # A string, not a collection: Prefect visits a task's result to link it to its state (a
    # dict of three cost a seventh of an item task's interpreter time, bench/batch.py).
    return idempotency_key


def handed_claim(owner: str, item_pk: int, token: str | None) -> Claim | None:
    """The claim the dispatcher of `owner` handed to this task, if it runs in this process
    (taken: a second take finds none). (Module functions, like `item_worked`, so a task
    pickled for Dask refers to them by name and never carries the registry or its lock.)"""
    with _guard:
        local = _local_flows.get(owner)
    return local.take(item_pk, token) if local is not None else None


def item_worked(owner: str, item_pk: int, outcome: str = "") -> None:
    """Tell the dispatcher of `owner`, if it runs in this process, that the item's work is
    over, and how it ended (`RunEngine.process`). (A module function, so a task pickled for
    Dask refers to it by name and never carries the dispatchers' queues.)"""
    with _guard:
        local = _local_flows.get(owner)
    if local is not None:
        events = local.events
        events.put(("worked", (item_pk, outcome)))


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
    load_result_storage(settings.result_storage)
    return settings.result_storage


def load_result_storage(slug: str) -> WritableFileSystem:
    """The Prefect filesystem block `slug` names (``block-type/name``), loaded from the API.
    Raises `ProviderConfigError` (one line, naming EPISODIC_RESULT_STORAGE) when it does
    not load or is not a writable filesystem block."""
    from prefect.blocks.core import Block

    try:
        block = Block.load(slug)
    except (ValueError, ObjectNotFound) as exc:
        raise ProviderConfigError(
            f"EPISODIC_RESULT_STORAGE: block {slug!r} does not load: {str(exc).splitlines()[0]}"
        ) from None
    if not isinstance(block, WritableFileSystem):
        raise ProviderConfigError(
            f"EPISODIC_RESULT_STORAGE: block {slug!r} is not a writable filesystem block"
        )
    return block


def prefect_executor(
    items: Sequence[Item],
    job: ItemJob,
    concurrency: int,
    stop: threading.Event,
    progress: Callable[[Item, str], None],
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
    scope = job.engine.claims.installation()
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
    running: dict[PrefectFuture[str], tuple[Item, Any]] = {}
    worked: set[int] = set()  # items in `running` whose work is over (their task finishing)
    local = _LocalFlow(job.engine)
    events = local.events
    with _guard:
        _local_flows[job.owner] = local
    try:
        while queue or running:
            room = concurrency - len(running) + len(worked)
            claimed, throttled = claim_next(queue, job, stop, room)
            for item, claim in claimed:
                with _guard:  # the task works it by ids (from here, or from the database)
                    local.handed[item.pk] = job.take(item.pk)
                work = {
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
                progress(item, "completed" if completed else "failed")
    except BaseException:  # the engine pauses the run and releases this owner's claims
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
        with _guard:
            _local_flows.pop(job.owner, None)


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
