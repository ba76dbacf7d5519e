"""`episodic providers check|list`: what each provider profile promises, and a check of its
credential that spends nothing (where the provider's API has a free call for it).

The capability row says, per profile: does create honour an idempotency key; can a job we
sent be found again, and how; can a job be cancelled; where an image's cost comes from; and
what happens on an ambiguous reply (a create whose acceptance is unknown).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from episodic.core.errors import ProviderConfigError
from episodic.pipeline.gate import CredentialSource
from episodic.providers.adapters import build_client
from episodic.providers.base import CannotCheck, ChecksCredential, ProviderError
from episodic.providers.profiles import Profile

_AMBIGUOUS_RESEND = "sent again with the same key: the provider returns the one job"
_AMBIGUOUS_LOOKUP = "looked up; until found, never sent again"
_AMBIGUOUS_OPERATOR = "left to an operator (never sent again)"


@dataclass(frozen=True, slots=True)
class CapabilityRow:
    profile: str
    kind: str
    idempotent_create: bool
    lookup: str  # how a job we sent is found again, or "no"
    cancel: str
    cost: str
    ambiguous: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "kind": self.kind,
            "idempotent_create": self.idempotent_create,
            "lookup": self.lookup,
            "cancel": self.cancel,
            "cost": self.cost,
            "on_ambiguous_reply": self.ambiguous,
        }


def capability_row(profile: Profile) -> CapabilityRow:
    """The row for a profile, from what its adapter declares (docs/providers.md)."""
    price = f"profile ({profile.price_text})"
    if profile.kind == "fake":
        return CapabilityRow(
            profile.id, "fake", True, "by client reference", "yes", price, _AMBIGUOUS_RESEND
        )
    if profile.kind == "http":
        lookup = (
            "by client reference (GET /predictions?client_reference=)" if profile.lookup else "no"
        )
        ambiguous = (
            _AMBIGUOUS_RESEND
            if profile.idempotent_create
            else _AMBIGUOUS_LOOKUP
            if profile.lookup
            else _AMBIGUOUS_OPERATOR
        )
        return CapabilityRow(
            profile.id,
            "http",
            profile.idempotent_create,
            lookup,
            "no",
            f"reply's cost_micros, else {price}",
            ambiguous,
        )
    if profile.kind == "replicate":
        seeded = profile.seed_input is not None and profile.lookup_by_input
        lookup = (
            f"by exact input among this model's predictions of the last "
            f"{profile.lookup_window_s} s (GET /v1/predictions?created_after=; "
            "lookup_by_input: no other installation uses this account)"
            if seeded
            else "no (the model takes no seed: inputs do not tell ours apart)"
            if profile.seed_input is None
            else "no (predictions carry nothing of ours; lookup_by_input to find them by "
            "input when no other installation uses this account)"
        )
        return CapabilityRow(
            profile.id,
            "replicate",
            False,
            lookup,
            "yes (POST /v1/predictions/{id}/cancel)",
            price,
            _AMBIGUOUS_LOOKUP if seeded else _AMBIGUOUS_OPERATOR,
        )
    return CapabilityRow(
        profile.id,
        "fal",
        False,
        "no (the queue lists nothing and carries no reference of ours)",
        "yes (PUT .../requests/{id}/cancel)",
        price,
        _AMBIGUOUS_OPERATOR,
    )


@dataclass(frozen=True, slots=True)
class CheckResult:
    ok: bool | None  # True: verified; False: refused or no answer; None: not all checkable
    message: str
    refused: bool = False  # ok False: the profile, credential, model or an input refused


def check_profile(profile: Profile, credentials: CredentialSource, state_dir: Path) -> CheckResult:
    """Verify the profile (its credential, model and input names) without spending: the
    adapter's free calls
    (`ChecksCredential`), never a submit. A check is not a paid command, so it needs no
    episode's gate. `state_dir`: the installation's home (see `episodic.providers.adapters`).
    Raises `ProviderConfigError` (no credential, malformed)."""
    if profile.kind == "fake":
        return CheckResult(True, "the fake provider is local: nothing to check")
    token = credentials.read(profile) if profile.needs_credential else None
    if token is None:
        raise ProviderConfigError(f"profile {profile.id!r} names no credential")
    client = build_client(profile, token, state_dir)
    try:
        if not isinstance(client, ChecksCredential):
            raise CannotCheck(f"the {profile.kind} adapter has no free call that verifies it")
        return CheckResult(True, client.check())
    except CannotCheck as exc:
        text = str(exc)
        if "cannot check without spending" not in text and "cannot be checked" not in text:
            text = f"cannot check without spending: {text}"
        return CheckResult(None, text)
    except ProviderConfigError as exc:
        return CheckResult(False, str(exc), refused=True)
    except ProviderError as exc:
        return CheckResult(False, f"no answer: {exc}")
    finally:
        client.close()
