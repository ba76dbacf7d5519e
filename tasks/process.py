"""What one process keeps across item tasks: `PROCESS`, one registry with `clear()`.

Item tasks carry ids only (`episodic.tasks.generate`), so each rebuilds what it works with: the
runner of its episode (cached per database, pipeline and episode), the settings (read again
only when an ``EPISODIC_*`` variable changed), and, when the task runs in the flow's own
process, the flow dispatching it (`LocalFlow`, looked up by the claim's owner).
"""

from __future__ import annotations

import os
import queue as queues
import threading
from dataclasses import dataclass, field, replace
from typing import Any

from episodic.core.records import ItemResult
from episodic.core.runs import Claim
from episodic.core.settings import Settings, load_settings
from episodic.pipeline.runner import Runner
from episodic.tasks.credentials import PrefectSecretCredentials


class ItemNotCompleted(Exception):
    """The item did not complete in this attempt (failed, unknown outcome, interrupted)."""


@dataclass
class LocalFlow:
    """A flow dispatching in this process, looked up by its claim owner by the item tasks that
    run here (the thread runner); a task elsewhere (Dask) finds none and works from the
    database alone.

    - `events`: a task tells its dispatcher the moment the item's work is over, so the next
      item is claimed while Prefect still finishes the task run;
    - `runner`: the flow's runner, shared instead of built per process (it also carries the
      flow's stop event, so an interrupted flow stops its tasks' work);
    - `handed`: the claims handed to tasks not yet started. A task takes its claim here
      instead of consuming the claim's token in the database (one write transaction less
      per item); the dispatcher frees a claim as unstarted (withdrawing its intent) only if
      it is still here, under the same lock, so a started task's intent is never withdrawn.
    """

    runner: Runner
    events: queues.SimpleQueue[tuple[str, Any]] = field(default_factory=queues.SimpleQueue)
    handed: dict[int, Claim] = field(default_factory=dict)

    def hand(self, claim: Claim) -> None:
        """Hand `claim` to the task that will work its item in this process."""
        with PROCESS.guard:
            self.handed[claim.item.pk] = claim

    def take(self, item_pk: int, token: str | None) -> Claim | None:
        with PROCESS.guard:
            claim = self.handed.get(item_pk)
            if claim is None or claim.token != token:
                return None
            del self.handed[item_pk]
        return replace(claim, token=None)  # consumed: its task has started

    def unstarted(self, claim: Claim) -> Claim:
        """`claim` as the dispatcher may free it: with its token if its task never took it
        (its intent is withdrawn), without if the task started (its intent stays open)."""
        with PROCESS.guard:
            if self.handed.pop(claim.item.pk, None) is not None:
                return claim
        return replace(claim, token=None)


@dataclass
class ProcessRegistry:
    """This process's caches and dispatchers, under one lock (`guard`); `building` lets one
    task build a runner while the others wait and take it."""

    runners: dict[tuple[str, str, str], Runner] = field(default_factory=dict)
    local_flows: dict[str, LocalFlow] = field(default_factory=dict)
    settings_by_env: dict[tuple[tuple[str, str], ...], Settings] = field(default_factory=dict)
    guard: threading.Lock = field(default_factory=threading.Lock)
    building: threading.Lock = field(default_factory=threading.Lock)

    def clear(self) -> None:
        """Forget every cached runner, dispatcher and settings (tests; a re-configured
        process)."""
        with self.guard:
            self.runners.clear()
            self.local_flows.clear()
            self.settings_by_env.clear()

    def local_flow(self, owner: str | None) -> LocalFlow | None:
        """The flow of claim owner `owner` if it dispatches in this process."""
        with self.guard:
            return self.local_flows.get(owner) if owner is not None else None

    def settings(self) -> Settings:
        """`load_settings()`, read again only when an ``EPISODIC_*`` variable changed
        (building the settings object per item cost a tenth of an item task's time,
        bench/batch.py)."""
        env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("EPISODIC_")))
        with self.guard:
            cached = self.settings_by_env.get(env)
        if cached is None:
            cached = load_settings()
            with self.guard:
                self.settings_by_env.clear()
                self.settings_by_env[env] = cached
        return cached


PROCESS = ProcessRegistry()


def item_runner(
    pipeline: str, episode_id: str, profile: str | None = None, owner: str | None = None
) -> Runner:
    """This process's runner for the episode: the flow's own runner when the task runs in
    the flow's process (looked up by the claim's `owner`; it also carries the flow's stop event),
    else one built from the environment on first use: the gate, the recorded plan's provider
    profile and a provider with its credential.

    `profile` is the provider profile the claim was made under: a runner cached for another
    profile (the episode was re-planned onto another provider while this worker lived) is
    rebuilt from the current plan, and a claim made under a profile that is no longer the
    plan's raises `ItemNotCompleted` (its intent names a provider this plan no longer uses).
    """
    from episodic.pipeline.generation import build_runner, prepare
    from episodic.storage.registry import engine_for

    local = PROCESS.local_flow(owner)
    if local is not None and profile in (None, local.runner.profile.id):
        return local.runner
    settings = PROCESS.settings()
    key = (settings.url, pipeline, episode_id)
    with PROCESS.guard:
        cached = PROCESS.runners.get(key)
    if cached is not None and profile in (None, cached.profile.id):
        return cached
    with PROCESS.building:  # one build per process: the other tasks wait and take it
        with PROCESS.guard:
            current = PROCESS.runners.get(key)
        if current is not None and current is not cached and profile in (None, current.profile.id):
            return current
        db = engine_for(settings)
        built = build_runner(
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
        with PROCESS.guard:
            PROCESS.runners[key] = built
        return built


def handed_claim(owner: str, item_pk: int, token: str | None) -> Claim | None:
    """The claim the dispatcher of `owner` handed to this task, if it runs in this process
    (taken: a second take finds none). (Module functions, like `item_worked`, so a task
    pickled for Dask refers to them by name and never carries the registry or its lock.)"""
    local = PROCESS.local_flow(owner)
    return local.take(item_pk, token) if local is not None else None


def item_worked(owner: str, item_pk: int, outcome: ItemResult | None = None) -> None:
    """Tell the dispatcher of `owner`, if it runs in this process, that the item's work is
    over, and how it ended (`Runner.process`; None: by an error). (A module function, so a
    task pickled for Dask refers to it by name and never carries the dispatchers' queues.)"""
    local = PROCESS.local_flow(owner)
    if local is not None:
        local.events.put(("worked", (item_pk, outcome)))
