"""The one seam to paid image providers: a small protocol, its data and its errors.

Errors are classified by what they *prove* about the provider's side (DESIGN 5)::

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
    └── CollectionPending           an accepted job whose output is not collected yet (poll or
                                    download errors, a status we do not know, not done in
                                    time): free to try again later, never bought again

`submit` raises only `NotCreated` subclasses and `UnknownOutcome`; `collect` raises only
`RemoteJobFailed`, `CollectionPending` and `Stopped`; `lookup` returns a remote reference only
when exactly one job carries our client reference (verified on the provider's reply, never
assumed from a filter) and raises `UnknownOutcome` when the answer is ambiguous.

What only some providers can do is a protocol of its own, declared by the adapter's class
(``class ReplicateProvider(JobsApiClient, CancelsJobs, ...)``: mypy checks the signatures)
and asked by ``isinstance``: `CancelsJobs`, `DescribesJobs`, `ChecksCredential`. They are
``runtime_checkable`` protocols rather than flags because the ability *is* the method: a
flag in `Capabilities` would be a second statement of it that could disagree with the
class, while ``isinstance`` narrows the type so the call that follows is type-checked.
(`Capabilities` keeps what is a promise about the provider's side, not a method of ours:
idempotent creates, lookups, concurrency, price.) `providers.registry` builds the adapters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from core.pricing import Price


class ProviderError(Exception):
    pass


class NotCreated(ProviderError):
    """The provider did not create a job for this call (documented refusal, or never sent)."""


class TransientProviderError(NotCreated):
    pass


class RateLimited(TransientProviderError):
    pass


class PermanentProviderError(NotCreated):
    pass


class UnknownOutcome(ProviderError):
    pass


class RemoteJobFailed(ProviderError):
    """The provider reports the job failed or was cancelled. `billed`: the provider charges
    for it (at what it reports: `reported_micros`, its own figure, or `compute_us`, the
    compute time it measured; else at the price's upper bound, `core.pricing`);
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


class CollectionPending(ProviderError):
    """The job was accepted but its output could not be collected yet (free to retry)."""


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a provider can promise; the engine's handling of unknown outcomes follows it.

    - ``idempotent_create``: sending the same create with the same client reference (also the
      ``Idempotency-Key``) never makes a second job, so an unknown outcome may be resolved by
      sending it again;
    - ``can_lookup``: a job can be found by the client reference we sent;
    - neither: an unknown outcome waits for an operator.
    """

    max_concurrency: int
    supports_seed: bool
    price: Price  # what an image costs, on its basis (`core.pricing`)
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

    def lookup(self, client_reference: str, request: ImageRequest | None = None) -> str | None:
        """The remote reference of the one job we submitted with this client reference
        (`request`: the call itself, for an API whose jobs carry no reference of ours and
        are found by their input)."""
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
