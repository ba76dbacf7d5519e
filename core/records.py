"""The words that cross layers as types: what a claim lets its holder do, why an item was
not claimed, how one item's work ended, what an episode event records, and an episode's
image.

Each word is a `StrEnum` whose values are the strings the database, the JSON output and the
logs always carried, so a member compares, hashes and serialises as that string.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from episodic.core.playlist import item_label


class ClaimAction(StrEnum):
    """What the holder of a claim does next (`episodic.core.runs.Claim.action`)."""

    SUBMIT = "submit"  # a new intent was committed with the claim: make the paid call
    COLLECT = "collect"  # an accepted job: fetch its output (free)
    RECONCILE = "reconcile"  # acceptance unknown: ask the provider, never a new paid call


class RefusalReason(StrEnum):
    """Why an item could not be claimed (`episodic.core.runs.Refusal.reason`)."""

    DONE = "done"  # completed
    BUSY = "busy"  # another live holder (`Refusal.holder_run`)
    EXHAUSTED = "exhausted"  # out of retries
    FAILED = "failed"  # failed in another run that still holds it
    STOPPED = "stopped"  # the run was paused, cancelled or completed
    # the run is failed: another process concluded it while this one still works, or the
    # sweep reaped it while this one was frozen; the caller may reopen it and ask again
    REOPEN = "reopen"
    THROTTLED = "throttled"  # the provider profile's limit of items in flight is reached
    # the next paid call would take the run's spend (--max-cost, --max-images, the per-run
    # cap) or its pipeline's period budget over the limit (`Refusal.detail` says which)
    BUDGET = "budget"
    # a claim that may only settle an open submission (a recovery's first pass, a run that
    # stopped buying at a limit) found none: the item needs a new paid call, not made now
    SETTLE_ONLY = "settle only"
    # failed, its paid output deleted at the provider before it was collected: buying it
    # again pays twice, which only `media restore --buy-again` does (it quotes and asks)
    LOST = "lost"


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
    # accepted, but the media store could not take its image: collected later, free; the
    # run stops buying (paused, `episodic.core.runs.STORE_STOPPED`) in every process
    NOT_STORED = "not stored"
    # the provider throttled past the bound it is waited out for: nothing was sent, the item
    # is pending again; the run stops buying (paused, `core.runs.THROTTLE_STOPPED`) in every
    # process
    THROTTLED = "throttled"
    TAKEN_OVER = "taken over"  # another holder took the item over and completes it


class EventKind(StrEnum):
    """What an episode event records besides a state change (``episode_events.kind``; the
    event of a state change is named by the `EpisodeState` entered)."""

    SLOT_REQUESTED = "slot_requested"  # a deployment asked for an allocated slot: who asked
    PROVIDER_CANCEL_ASKED = "provider_cancel_asked"  # committed before the provider's call
    PROVIDER_CANCEL = "provider_cancel"  # what the provider answered a cancel
    MIGRATED = "migrated"  # the episode was imported from the legacy system
    FLOW_RUN_LINKED = "prefect_flow_run"  # which Prefect flow runs worked on a run


@dataclass(frozen=True, slots=True)
class EpisodeImage:
    """One completed, paid-for image of an episode: the one place an image's facts live.

    Built by the ledger (`episodic.storage.ledger.completed_outputs`: a completed item with its
    succeeded submission and that call's cost) and read, never rebuilt, by approval, the
    approval form and assembly; a manifest or a form names the fields it shows itself.
    """

    idempotency_key: str  # the item's key: the same image in every plan that asks for it
    video_id: str
    part: int  # 0 for a hero candidate
    candidate: int | None  # 1..N for a hero candidate, None for a part of a video
    position: int  # 1-based position of the video in the playlist it was planned from
    key: str | None  # its media store key (`episodic.core.media.content_key`); None: legacy row
    sha256: str  # hex digest of the image's bytes, recorded when it was paid for
    size: int | None  # bytes (None for a legacy row)
    media_type: str | None  # image/png, image/jpeg or image/webp (None for a legacy row)
    legacy_path: str | None  # the absolute file of a row written before the media store
    remote_ref: str | None  # the provider's id of the paid call's job
    cost_micros: int  # what the paid call cost, in micro-units of `currency`
    currency: str

    @property
    def item_id(self) -> str:
        """How people see the image's item: `v01.p2`, or `v01.c3` for a hero candidate."""
        return item_label(self.video_id, self.part, self.candidate)
