"""Run and item states and the transitions between them (DESIGN 5), enforced in one place."""

from __future__ import annotations

from enum import StrEnum

from core.errors import InvalidTransition


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

ITEM_TRANSITIONS: dict[ItemState, frozenset[ItemState]] = {
    ItemState.PENDING: frozenset({ItemState.RUNNING, ItemState.CANCELLED}),
    ItemState.RUNNING: frozenset({ItemState.COMPLETED, ItemState.FAILED, ItemState.CANCELLED}),
    ItemState.FAILED: frozenset({ItemState.RUNNING, ItemState.CANCELLED}),
    ItemState.COMPLETED: frozenset(),
    ItemState.CANCELLED: frozenset({ItemState.PENDING}),
}

ACTIVE_RUN_STATES = frozenset({RunState.PENDING, RunState.RUNNING})
# A live run may still work on its items: it keeps them (a cancel elsewhere leaves them
# pending, and a job a cancelled run sent for one of them is kept for it).
LIVE_RUN_STATES = (RunState.PENDING, RunState.RUNNING, RunState.PAUSED)
# A submission without an outcome yet: its paid call was or may have been made.
OPEN_SUBMISSION_STATES = (SubmissionState.INTENT, SubmissionState.ACCEPTED, SubmissionState.UNKNOWN)


def check_run_transition(current: str, target: str) -> None:
    if RunState(target) not in RUN_TRANSITIONS[RunState(current)]:
        raise InvalidTransition(f"run cannot go from {current} to {target}")


def check_item_transition(current: str, target: str) -> None:
    if ItemState(target) not in ITEM_TRANSITIONS[ItemState(current)]:
        raise InvalidTransition(f"item cannot go from {current} to {target}")


class EpisodeState(StrEnum):
    ALLOCATED = "allocated"
    GENERATED = "generated"  # every planned image completed
    APPROVED = "approved"
    REJECTED = "rejected"
    ASSEMBLED = "assembled"


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
FROZEN_PLAN_STATES = frozenset({EpisodeState.APPROVED, EpisodeState.ASSEMBLED})
DECIDED_STATES = frozenset({EpisodeState.APPROVED, EpisodeState.REJECTED, EpisodeState.ASSEMBLED})
# `episodic reopen` sends these back to `allocated` (recorded with who and why)
REOPENABLE_STATES = DECIDED_STATES


def check_episode_transition(current: str, target: str) -> None:
    if EpisodeState(target) not in EPISODE_TRANSITIONS[EpisodeState(current)]:
        raise InvalidTransition(f"episode cannot go from {current} to {target}")
