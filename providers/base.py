"""The one seam to paid image providers: a small protocol, its data and its errors.

Errors::

    ProviderError
    ├── TransientProviderError      safe to retry the same call (nothing was accepted)
    │   └── RateLimited
    ├── PermanentProviderError      the provider refused; retrying will not help
    └── UnknownOutcome              the call may have been accepted: never resubmit blindly
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class ProviderError(Exception):
    pass


class TransientProviderError(ProviderError):
    pass


class RateLimited(TransientProviderError):
    pass


class PermanentProviderError(ProviderError):
    pass


class UnknownOutcome(ProviderError):
    pass


@dataclass(frozen=True, slots=True)
class Capabilities:
    max_concurrency: int
    supports_seed: bool
    cost_per_image_minor: int
    currency: str
    can_lookup: bool  # can find a job by the client reference we sent


@dataclass(frozen=True, slots=True)
class ImageRequest:
    client_reference: str  # also the Idempotency-Key of the call
    episode_id: str
    item_id: str
    prompt: str
    seed: int


@dataclass(frozen=True, slots=True)
class ImageResult:
    content: bytes
    media_type: str
    cost_minor: int


class Provider(Protocol):
    capabilities: Capabilities

    def submit(self, request: ImageRequest) -> str:
        """Start a paid job; return its remote task reference."""
        ...

    def collect(self, remote_ref: str, *, deadline_s: float, should_stop: StopCheck) -> ImageResult:
        """Wait for the job and return its output (raises on failure or when told to stop)."""
        ...

    def lookup(self, client_reference: str) -> str | None:
        """The remote reference of a job we submitted with this client reference, if any."""
        ...

    def close(self) -> None: ...


class StopCheck(Protocol):
    def __call__(self) -> bool: ...


class Stopped(Exception):
    """Raised from a wait when the caller asked to stop (interrupt, cancellation)."""
