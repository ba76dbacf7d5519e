"""The one seam to paid image providers: a small protocol, its data and its errors.

Errors are classified by what they *prove* about the provider's side::

    ProviderError
    ├── NotCreated                  proven: no job exists for this call
    │   ├── TransientProviderError  safe to send the same call again (never sent, 429, ...)
    │   │   └── RateLimited
    │   └── PermanentProviderError  refused (validation, auth); sending again will not help
    ├── UnknownOutcome              the request may have left the machine: a job may exist.
    │                               Never answered by a new paid call; resolved by sending the
    │                               *same* call again (only if the provider honours idempotent
    │                               create), by `lookup`, or by an operator
    ├── RemoteJobFailed             the provider says the accepted job itself failed
    ├── OutputGone                  the provider proves the accepted job's output no longer
    │                               exists (deleted after its retention): paid, never
    │                               collectable again; only a new paid call replaces it
    └── CollectionPending           an accepted job whose output is not collected yet (poll or
                                    download errors, a status we do not know, not done in
                                    time): free to try again later, never bought again

`submit` raises only `NotCreated` subclasses and `UnknownOutcome`; `collect` raises only
`RemoteJobFailed`, `OutputGone`, `CollectionPending` and `Stopped`; `lookup` returns a
remote reference only when exactly one job carries our client reference (verified on the
provider's reply, never assumed from a filter), never counting a job the ledger records for
another submission, and raises `AmbiguousLookup` (an `UnknownOutcome` naming the
candidates) when more than one remains.

What only some providers can do is a protocol of its own, declared by the adapter's class
(``class ReplicateProvider(JobsApiClient, CancelsJobs, ...)``: mypy checks the signatures)
and asked by ``isinstance``: `CancelsJobs`, `DescribesJobs`, `ChecksCredential`. They are
``runtime_checkable`` protocols rather than flags because the ability *is* the method: a
flag in `Capabilities` would be a second statement of it that could disagree with the
class, while ``isinstance`` narrows the type so the call that follows is type-checked.
(`Capabilities` keeps what is a promise about the provider's side, not a method of ours:
idempotent creates, lookups, concurrency, price.) `episodic.providers.adapters` builds the adapters.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from episodic.core.pricing import Price


class ProviderError(Exception):
    pass


class NotCreated(ProviderError):
    """The provider did not create a job for this call (documented refusal, or never sent)."""


class TransientProviderError(NotCreated):
    pass


class RateLimited(TransientProviderError):
    """The provider refused the call for now (429, or 503 with ``Retry-After``): nothing was
    made. `retry_after_s`: when it said to come back, in seconds from its answer (its
    ``Retry-After``, parsed strictly; None: it did not say); `detail`: its own words (bounded,
    control characters removed), or ""."""

    def __init__(
        self, message: str, *, retry_after_s: float | None = None, detail: str = ""
    ) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.detail = detail


class PermanentProviderError(NotCreated):
    """Refused: sending the same call again will not help. `status`: the HTTP status of the
    refusal when there was one (401/403 a credential, 402 credit, 422 the input)."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class UnknownOutcome(ProviderError):
    pass


class AmbiguousLookup(UnknownOutcome):
    """A lookup found more than one job that could be ours (none of them recorded for
    another submission): `candidates`, (job id, when the provider says it was created),
    for an operator to choose from (`episodic runs adopt`)."""

    def __init__(self, message: str, candidates: tuple[tuple[str, str], ...]) -> None:
        super().__init__(message)
        self.candidates = candidates

    @classmethod
    def among(cls, found: dict[str, str], what: str) -> AmbiguousLookup:
        """The ambiguity of `found` (job id -> its creation time as the provider says it),
        oldest first, at most five named."""
        candidates = tuple(sorted(found.items(), key=lambda pair: pair[1]))[:5]
        listed = ", ".join(f"{ref} (created {at or '?'})" for ref, at in candidates)
        return cls(
            f"lookup: ambiguous: {len(found)} {what}s match ours, none recorded for another "
            f"item: {listed}",
            candidates,
        )


# Whether the ledger records a job id for another submission (any item, any episode): a
# lookup never counts such a job as the one it looks for.
RecordedElsewhere = Callable[[str], bool]


class RemoteJobFailed(ProviderError):
    """The provider reports the job failed or was cancelled. `billed`: the provider charges
    for it (at what it reports: `reported_micros`, its own figure, or `compute_us`, the
    compute time it measured; else at the price's upper bound, `episodic.core.pricing`);
    `cancelled`: the provider's own status says the job was cancelled (on a cancel request),
    not that it failed."""

    def __init__(
        self,
        message: str,
        *,
        billed: bool = True,
        reported_micros: int | None = None,
        compute_us: int | None = None,
        cancelled: bool = False,
    ) -> None:
        super().__init__(message)
        self.billed = billed
        self.reported_micros = reported_micros
        self.compute_us = compute_us
        self.cancelled = cancelled


class OutputGone(ProviderError):
    """The provider proves the accepted job's output no longer exists: a finished job whose
    reply says its data was removed (Replicate's ``data_removed``), or a delivery answered
    404/410 again after a fresh poll. The job was paid; collecting it again cannot succeed.
    `compute_us`: the compute time the provider reported for it, if any."""

    def __init__(self, message: str, *, compute_us: int | None = None) -> None:
        super().__init__(message)
        self.compute_us = compute_us


class CollectionPending(ProviderError):
    """The job was accepted but its output could not be collected yet (free to retry)."""


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a provider can promise; the engine's handling of unknown outcomes follows it.

    - ``idempotent_create``: sending the same create with the same client reference (also the
      ``Idempotency-Key``) never makes a second job, so an unknown outcome may be resolved by
      sending it again;
    - ``can_lookup``: the provider looks a job up by the client reference it carries;
    - neither: an unknown outcome waits for an operator.
    """

    max_concurrency: int
    supports_seed: bool
    price: Price  # what an image costs, on its basis (`episodic.core.pricing`)
    can_lookup: bool
    idempotent_create: bool = False

    @property
    def currency(self) -> str:
        return self.price.currency


@dataclass(frozen=True, slots=True)
class ImageRequest:
    client_reference: str  # also the Idempotency-Key of the call
    episode_id: str
    item_id: str
    prompt: str
    seed: int
    reference_image: str | None = None  # the plan's reference image, a data: URI


@dataclass(frozen=True, slots=True)
class ImageResult:
    """A collected output: its bytes and declared media type, and what the provider's reply
    says of its cost: `reported_micros` (its own figure, micro-units of the profile's
    currency; None: it reports none) and `compute_us` (the job's compute time in
    microseconds, as `metrics.predict_time`; None: not reported)."""

    content: bytes
    media_type: str
    reported_micros: int | None = None
    compute_us: int | None = None


class Provider(Protocol):
    capabilities: Capabilities

    def submit(self, request: ImageRequest) -> str:
        """Start a paid job; return its remote task reference."""
        ...

    def collect(self, remote_ref: str, *, deadline_s: float, should_stop: StopCheck) -> ImageResult:
        """Wait for the job and return its output (raises on failure or when told to stop)."""
        ...

    def lookup(
        self,
        client_reference: str,
        request: ImageRequest | None = None,
        *,
        recorded: RecordedElsewhere | None = None,
    ) -> str | None:
        """The remote reference of the one job we submitted with this client reference
        (`request`: the call itself, for an API whose jobs carry no reference of ours and
        are matched on their input), never one `recorded` says is another submission's;
        `AmbiguousLookup` when more than one remains."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class CancelsJobs(Protocol):
    """A provider that can be asked to stop a job it accepted."""

    def cancel(self, remote_ref: str) -> str:
        """Ask the provider to cancel the job; its answer (the status it reports after the
        call, e.g. ``canceled``, ``CANCELLATION_REQUESTED``, ``ALREADY_COMPLETED``). Raises
        `UnknownOutcome` when the answer is not known."""
        ...


@runtime_checkable
class DescribesJobs(Protocol):
    """A provider whose jobs carry nothing of ours: it says where an operator finds the job
    of a create whose reply was lost (a model's job list, by the item's prompt and seed)."""

    def how_to_find(self, request: ImageRequest) -> str: ...


class NotOurJob(ProviderError):
    """The provider's job is not the one an item's paid call asked for (another model, other
    input), or the provider has no such job: it is never recorded for the item."""


@runtime_checkable
class VerifiesJobs(Protocol):
    """A provider whose job can be read by its id without spending, so that a job an
    operator found (`episodic runs adopt`) is proven to be the item's before the ledger
    records it."""

    def verify_job(self, remote_ref: str, request: ImageRequest) -> str:
        """What was verified of job `remote_ref` against `request` (one line). Raises
        `NotOurJob` (no such job, another model, other input, nothing to verify it by) or
        `UnknownOutcome` (no usable answer)."""
        ...


@runtime_checkable
class ChecksCredential(Protocol):
    """A provider whose credential can be verified (or said not to be verifiable) without
    spending: ``episodic providers check``."""

    def check(self) -> str:
        """What the provider said of the credential. Raises `CannotCheck` (no free call),
        `ProviderConfigError` (the credential was refused), `ProviderError` (no answer)."""
        ...


class StopCheck(Protocol):
    def __call__(self) -> bool: ...


class CannotCheck(Exception):
    """The provider offers no way to verify a profile without spending."""


class Stopped(Exception):
    """Raised from a wait when the caller asked to stop (interrupt, cancellation)."""
