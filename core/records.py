"""The words that cross layers as types: what a claim lets its holder do, why an item was
not claimed, and how one item's work ended.

Each is a `StrEnum` whose values are the strings the database, the JSON output and the logs
always carried, so a member compares, hashes and serialises as that string.
"""

from __future__ import annotations

from enum import StrEnum


class ClaimAction(StrEnum):
    """What the holder of a claim does next (`core.runs.Claim.action`)."""

    SUBMIT = "submit"  # a new intent was committed with the claim: make the paid call
    COLLECT = "collect"  # an accepted job: fetch its output (free)
    RECONCILE = "reconcile"  # acceptance unknown: ask the provider, never a new paid call


class RefusalReason(StrEnum):
    """Why an item could not be claimed (`core.runs.Refusal.reason`)."""

    DONE = "done"  # completed
    BUSY = "busy"  # another live holder (`Refusal.holder_run`)
    EXHAUSTED = "exhausted"  # out of retries
    FAILED = "failed"  # failed in another run that still holds it
    STOPPED = "stopped"  # the run was paused, cancelled or completed
    # the run is failed: another process concluded it while this one still works, or the
    # sweep reaped it while this one was frozen; the caller may reopen it and ask again
    REOPEN = "reopen"
    THROTTLED = "throttled"  # the provider profile's limit of items in flight is reached


class ItemResult(StrEnum):
    """How one item's work in this process ended (`Runner.process`, the progress callback)."""

    COMPLETED = "completed"
    FAILED = "failed"
    SKIPPED = "skipped"  # out of retries, or failed in another run: nothing to do here
    UNKNOWN = "unknown"  # acceptance unknown: reconciled later, never resubmitted
    INTERRUPTED = "interrupted"  # the run stopped (a cancel, Ctrl-C, a pause)
    # accepted but not ready within the collect timeout: its open submission keeps a
    # provider slot, so a throttled executor collects it again before it waits for a slot
    COLLECT_LATER = "collect later"
    TAKEN_OVER = "taken over"  # another holder took the item over and completes it
