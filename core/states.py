"""Every state machine of the ledger: runs, items, submissions and episodes.

Each table is what the storage statements do, no more: every statement that moves a state
carries a label ``# <machine>: <sources> -> <target>`` (`storage.statements`), and a unit test
checks each label against these tables, and each table move against the labels. A state
moves only by a guarded statement (``UPDATE … WHERE state IN (:sources)``, rowcount checked);
the tables decide the sources where a statement takes them from here (`sources_of`).
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from episodic.core.errors import InvalidTransition


class RunState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    PAUSED = "paused"


class ItemState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class SubmissionState(StrEnum):
    INTENT = "intent"  # committed before the paid call; no outcome known yet
    ACCEPTED = "accepted"  # the provider took it: remote task reference recorded
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # the provider refused it or the remote task failed
    UNKNOWN = "unknown"  # the call may or may not have been accepted: never resubmitted


class EpisodeState(StrEnum):
    ALLOCATED = "allocated"
    GENERATED = "generated"  # every planned image completed
    APPROVED = "approved"
    REJECTED = "rejected"
    ASSEMBLED = "assembled"


RUN_TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    RunState.PENDING: frozenset({RunState.RUNNING, RunState.CANCELLED}),
    RunState.RUNNING: frozenset(
        {RunState.COMPLETED, RunState.FAILED, RunState.CANCELLED, RunState.PAUSED}
    ),
    RunState.PAUSED: frozenset({RunState.RUNNING, RunState.CANCELLED}),
    RunState.FAILED: frozenset({RunState.RUNNING}),
    RunState.COMPLETED: frozenset(),
    RunState.CANCELLED: frozenset(),
}

# An item is claimed (-> running) from any state but completed: pending, failed (a retry),
# cancelled (a run that includes it again claims it; admission restarts it to pending
# first, a resumed run of its own may claim it as it is) and running, when its holder's
# lease expired (a takeover) or the holder is the claimer itself. A running item is given up
# (-> failed, resumable) by its holder or by the sweep once its lease expired, or put back
# (-> pending) by its holder when nothing was sent for it and nothing failed: a provider's
# throttle past the bound paused the run before its call (its intent withdrawn). Only a pending
# item is cancelled (no live run includes it): a running one stays with its holder. A
# completed item whose image the store lost and the provider no longer serves goes back to
# pending, only by `media restore --buy-again` (the loss recorded in `lost_outputs`, its
# paid call kept as succeeded): a new paid attempt, admitted and capped like any other.
ITEM_TRANSITIONS: dict[ItemState, frozenset[ItemState]] = {
    ItemState.PENDING: frozenset({ItemState.RUNNING, ItemState.CANCELLED}),
    ItemState.RUNNING: frozenset(
        {ItemState.RUNNING, ItemState.COMPLETED, ItemState.FAILED, ItemState.PENDING}
    ),
    # failed -> pending: `media restore --buy-again`, confirmed, for an output gone at the
    # provider (refused to every other claim until then)
    ItemState.FAILED: frozenset({ItemState.RUNNING, ItemState.PENDING}),
    ItemState.COMPLETED: frozenset({ItemState.PENDING}),
    ItemState.CANCELLED: frozenset({ItemState.PENDING, ItemState.RUNNING}),
}

# A submission is created as an intent (before the paid call) and never goes back: an
# unsettled one (intent, unknown) is accepted when the provider's job is known, marked unknown
# again when a further look finds nothing (the reason replaced), or closed failed; an accepted
# one succeeds with its cost or fails. An intent that provably never left the machine is
# withdrawn: its row deleted and the attempt given back (`DELETABLE_SUBMISSION_STATES`).
SUBMISSION_TRANSITIONS: dict[SubmissionState, frozenset[SubmissionState]] = {
    SubmissionState.INTENT: frozenset(
        {SubmissionState.ACCEPTED, SubmissionState.UNKNOWN, SubmissionState.FAILED}
    ),
    SubmissionState.UNKNOWN: frozenset(
        {SubmissionState.ACCEPTED, SubmissionState.UNKNOWN, SubmissionState.FAILED}
    ),
    SubmissionState.ACCEPTED: frozenset({SubmissionState.SUCCEEDED, SubmissionState.FAILED}),
    SubmissionState.SUCCEEDED: frozenset(),
    SubmissionState.FAILED: frozenset(),
}
DELETABLE_SUBMISSION_STATES = frozenset({SubmissionState.INTENT})

# Back to `allocated`: a changed plan before approval (its images must be generated and
# reviewed again), or `episodic reopen` (recorded with who and why) after a decision. Nothing
# else moves a decided episode: what was approved is what ships, and a rejection stands until
# its plan changes or it is reopened (never `rejected -> generated`: a generate with nothing to
# do must not undo a person's decision).
EPISODE_TRANSITIONS: dict[EpisodeState, frozenset[EpisodeState]] = {
    EpisodeState.ALLOCATED: frozenset({EpisodeState.GENERATED}),
    EpisodeState.GENERATED: frozenset(
        {EpisodeState.APPROVED, EpisodeState.REJECTED, EpisodeState.ALLOCATED}
    ),
    EpisodeState.REJECTED: frozenset({EpisodeState.ALLOCATED}),
    EpisodeState.APPROVED: frozenset({EpisodeState.ASSEMBLED, EpisodeState.ALLOCATED}),
    EpisodeState.ASSEMBLED: frozenset({EpisodeState.ALLOCATED}),
}

# The state a new row of each machine is inserted with.
INITIAL_STATES: dict[str, str] = {
    "run": RunState.PENDING,
    "item": ItemState.PENDING,
    "submission": SubmissionState.INTENT,
    "episode": EpisodeState.ALLOCATED,
}
# Each machine's table by the name its labels use.
TRANSITIONS: dict[str, dict[str, frozenset[str]]] = {
    "run": {k.value: frozenset(v) for k, v in RUN_TRANSITIONS.items()},
    "item": {k.value: frozenset(v) for k, v in ITEM_TRANSITIONS.items()},
    "submission": {k.value: frozenset(v) for k, v in SUBMISSION_TRANSITIONS.items()},
    "episode": {k.value: frozenset(v) for k, v in EPISODE_TRANSITIONS.items()},
}
# Each machine's states, and its table in the database (whose `state` column holds them).
STATES: dict[str, type[StrEnum]] = {
    "run": RunState,
    "item": ItemState,
    "submission": SubmissionState,
    "episode": EpisodeState,
}
TABLES: dict[str, str] = {
    "run": "runs",
    "item": "items",
    "submission": "submissions",
    "episode": "episodes",
}

# ------------------------------------------------------------------ named state groups
# A live run may still work on its items: it keeps them (a cancel elsewhere leaves them
# pending, and a job a cancelled run sent for one of them is kept for it).
LIVE_RUN_STATES = (RunState.PENDING, RunState.RUNNING, RunState.PAUSED)
# A submission without an outcome yet: its paid call was or may have been made.
OPEN_SUBMISSION_STATES = (SubmissionState.INTENT, SubmissionState.ACCEPTED, SubmissionState.UNKNOWN)
# Open, and no provider job recorded: what an acceptance, a refusal or an unknown settles.
UNSETTLED_SUBMISSION_STATES = (SubmissionState.INTENT, SubmissionState.UNKNOWN)
FROZEN_PLAN_STATES = frozenset({EpisodeState.APPROVED, EpisodeState.ASSEMBLED})
DECIDED_STATES = frozenset({EpisodeState.APPROVED, EpisodeState.REJECTED, EpisodeState.ASSEMBLED})
# `episodic reopen` sends these back to `allocated` (recorded with who and why)
REOPENABLE_STATES = DECIDED_STATES


def sources_of(machine: str, target: str) -> list[str]:
    """The states of `machine` ("run", "item", "submission", "episode") from which `target`
    may be reached, in the table's order (the ``IN (…)`` list of a guarded statement)."""
    return [s for s, targets in TRANSITIONS[machine].items() if target in targets]


def check_transition(machine: str, current: str, target: str) -> None:
    """Raise `InvalidTransition` unless `machine`'s table allows `current` -> `target`.

    `machine` is one of "run", "item", "submission", "episode"; a state the machine does not
    have is not allowed either (the database's CHECK constraints refuse it too)."""
    if target not in TRANSITIONS[machine].get(current, frozenset()):
        raise InvalidTransition(f"{machine} cannot go from {current} to {target}")


def states_in_sql(states: Iterable[str]) -> str:
    """``state IN ('a', 'b')``: literal names from our own enums, in the order given."""
    return "state IN (" + ", ".join(f"'{s}'" for s in states) + ")"


def state_check_sql(machine: str) -> str:
    """The CHECK constraint's condition that keeps `machine`'s state column to its states,
    in the enum's order (`storage.models`)."""
    return states_in_sql(s.value for s in STATES[machine])
