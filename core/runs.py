"""Domain objects of paid generation runs (rows stay in `storage`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from episodic.core.playlist import item_label
from episodic.core.records import ClaimAction, RefusalReason
from episodic.core.states import ItemState

INTERRUPTED = "interrupted"
"""The error of an item its holder gave up when its process was interrupted (Ctrl-C,
SIGTERM): resumable, and finished by another process still working on the run."""


@dataclass(frozen=True, slots=True)
class Run:
    run_id: str
    episode_id: str
    pipeline: str
    command: str
    state: str
    params: dict[str, Any]
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    error_text: str | None
    heartbeat_at: datetime | None = None
    lease_expires_at: datetime | None = None
    idempotency_key: str | None = None
    batch_id: str | None = None
    fingerprint: str | None = None
    plan_id: int | None = None  # the recorded plan the run was admitted for


REPLANNED = "re-planned"
"""The error text of a run cancelled because its episode was re-planned while it worked."""

STORE_STOPPED = "stopped buying:"
"""The start of the error text of a run paused at its first paid image the media store could
not take (``stopped buying: media store s3://… is unavailable: …``): no process of the run
claims or reopens it, its accepted jobs wait to be collected at no cost by a resume."""


BUDGET_STOPPED = f"{STORE_STOPPED} budget reached:"
"""The start of the error text of a run paused because its next paid call would pass a cap
or a period budget (``stopped buying: budget reached: --max-cost 0.80 USD: …``): the
`STORE_STOPPED` flavour, so no process reopens it; `runs resume` with a bigger limit, or a
raised budget, goes on."""


PRICE_STOPPED = f"{STORE_STOPPED} charge above the price:"
"""The start of the error text of a run paused because the provider billed one of its calls
above its price's stated bound (``stopped buying: charge above the price: job … charged
0.05 USD, …``): the `STORE_STOPPED` flavour; every later call of that price would be
reserved below what the provider bills, so the run buys nothing more until the price is
corrected and the run resumed."""


def price_stopped(error_text: str | None) -> bool:
    """The run's error text says a charge above its price's bound paused it (`PRICE_STOPPED`)."""
    return (error_text or "").startswith(PRICE_STOPPED)


THROTTLE_STOPPED = f"{STORE_STOPPED} throttled:"
"""The start of the error text of a run paused because its provider throttled it past the
bound it is waited out for (``stopped buying: throttled: provider profile 'flux' ...``): the
`STORE_STOPPED` flavour, so no process reopens it; nothing was paid for what it did not buy,
and `runs resume` goes on once the provider takes calls again."""


def throttle_stopped(error_text: str | None) -> bool:
    """The run's error text says it was paused by a provider's throttle (`THROTTLE_STOPPED`)."""
    return (error_text or "").startswith(THROTTLE_STOPPED)


def budget_stopped(error_text: str | None) -> bool:
    """The run's error text says it was paused at a cap or a budget (`BUDGET_STOPPED`)."""
    return (error_text or "").startswith(BUDGET_STOPPED)


def store_stopped(error_text: str | None) -> bool:
    """The run's error text says it was paused by a media store failure (`STORE_STOPPED`)."""
    return (error_text or "").startswith(STORE_STOPPED)


@dataclass(frozen=True, slots=True)
class Item:
    pk: int
    idempotency_key: str
    position: int
    video_id: str
    part: int  # 0 for a hero candidate
    prompt: str
    seed: int
    state: str
    attempts: int
    error_text: str | None
    created_at: datetime | None = None
    candidate: int | None = None  # 1..N for a hero candidate

    @property
    def ledger_ref(self) -> str:
        """This row in this database: stable across retries, different in another database."""
        stamp = self.created_at.isoformat() if self.created_at else "?"
        return f"{self.pk}@{stamp}"

    @property
    def item_id(self) -> str:
        return item_label(self.video_id, self.part, self.candidate)


@dataclass(frozen=True, slots=True)
class Submission:
    pk: int
    item_pk: int
    attempt: int
    client_reference: str
    state: str
    remote_ref: str | None


def claim_live(state: str, lease_expires_at: datetime | None, now: datetime) -> bool:
    """An item is held by a live claim: running under a lease that ends after `now` (its
    holder renews it). Evaluated on rows in memory; `episodic.storage.predicates.held_by_live_claim`
    is the same rule in SQL."""
    return state == ItemState.RUNNING and lease_expires_at is not None and lease_expires_at > now


@dataclass(frozen=True, slots=True)
class ItemSnapshot:
    """What planning needs to know of an existing item (one set-based query)."""

    state: str
    attempts: int
    lease_expires_at: datetime | None  # a running item's claim is live until then
    open_submission: str | None  # state of a submission without outcome: intent/accepted/unknown
    claim_run_id: str | None = None
    # failed, its newest paid call's output deleted at the provider: only `media restore
    # --buy-again` buys it again (`episodic.storage.provider_outputs`)
    output_gone: bool = False

    def held(self, now: datetime) -> bool:
        """Running under a live claim: its holder is alive and will finish it."""
        return claim_live(self.state, self.lease_expires_at, now)


@dataclass(frozen=True, slots=True)
class Claim:
    """The right to work on one item, held by `owner` until `lease` expires.

    `action` says what the holder does next (`ClaimAction`: submit, collect or reconcile).
    """

    item: Item
    run_id: str
    owner: str
    action: ClaimAction
    submission: Submission | None
    token: str | None = None  # one execution of the claim elsewhere (`load_claim`)
    # time.monotonic() when the transaction that made or loaded the claim proved it ours,
    # live, and its run running (None: never proved in this process)
    verified_at: float | None = None


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why an item could not be claimed (`RefusalReason`: each member says what it means);
    `holder_run` is the run that holds or completed the item, when one does."""

    reason: RefusalReason
    holder_run: str | None = None
    detail: str | None = None  # a ``budget`` refusal: the limit, the spend, what is in flight
    # a ``throttled`` refusal at the provider profile's recorded throttle: the moment it
    # takes new paid calls again (`episodic.storage.throttles`)
    until: datetime | None = None


@dataclass(frozen=True, slots=True)
class RunCounts:
    completed: int = 0
    failed: int = 0
    pending: int = 0
    running: int = 0
    cancelled: int = 0
    paid_submissions: int = 0
    cost_micros: int = 0
    currency: str = "USD"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class PlanReport:
    """What a run would do, before anything is written."""

    new_calls: int  # paid submissions the run would make
    skipped: int  # already completed
    busy: int  # running in another, live run
    to_collect: int  # accepted earlier, result not collected yet: no new paid call
    to_reconcile: int  # acceptance unknown: ask the provider, never resubmit automatically
    exhausted: int  # failed max_retries + 1 times: left alone
    estimated_cost_micros: int
    currency: str
    new_keys: tuple[str, ...] = field(default=(), repr=False)
    reuse_keys: tuple[str, ...] = field(default=(), repr=False)
    hero_calls: int = 0  # of new_calls: candidates of hero images
    lost: int = 0  # failed, their paid output gone at the provider: left to buy-again

    @property
    def has_work(self) -> bool:
        """Something to submit, collect, reconcile or follow (else no run is created)."""
        return bool(self.new_calls or self.busy or self.to_collect or self.to_reconcile)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("new_keys")
        data.pop("reuse_keys")
        return data
