"""The one table from a profile's kind to the adapter that speaks its API, and the one place
a provider client is constructed.

`build_client` is called from two places only, each with its own reason to be allowed:
``episodic.pipeline.gate.build_provider`` (every paid command: it asks for the `GatePass` of an
episode that exists, and reads the credential) and ``pipeline.provider_check.check_profile``
(``episodic providers check``: a free call, no episode, and never a method that spends).
Adapters are imported when their kind is built, so a run on one provider never imports the
others' modules.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from episodic.core.errors import ProviderConfigError
from episodic.core.output_files import RecordPaths
from episodic.providers.base import Provider
from episodic.providers.profiles import Profile

Factory = Callable[[Profile, str | None, Path], Provider]
"""(profile, credential or None, state folder) -> the adapter. The state folder is the
installation's home: only the fake keeps jobs there (its "server side"), unless
``EPISODIC_FAKE_PROVIDER_DIR`` names the folder every machine shares (`episodic.providers.fake`)."""


def _fake(profile: Profile, credential: str | None, state_dir: Path) -> Provider:
    from episodic.providers.fake import FakeProvider, jobs_folder

    return FakeProvider(
        profile_id=profile.id,
        state_dir=jobs_folder(state_dir),
        price=profile.pricing,
        max_concurrency=profile.max_concurrency,
        delay_ms=profile.delay_ms,
        credential=credential,
    )


def _replicate(profile: Profile, credential: str | None, state_dir: Path) -> Provider:
    from episodic.providers.replicate import ReplicateProvider

    return ReplicateProvider(profile=profile, token=_needed(profile, credential))


def _fal(profile: Profile, credential: str | None, state_dir: Path) -> Provider:
    from episodic.providers.fal import FalProvider

    return FalProvider(profile=profile, token=_needed(profile, credential))


def _http(profile: Profile, credential: str | None, state_dir: Path) -> Provider:
    from episodic.providers.http import HttpProvider

    return HttpProvider(profile=profile, token=_needed(profile, credential))


ADAPTERS: dict[str, Factory] = {
    "fake": _fake,
    "replicate": _replicate,
    "fal": _fal,
    "http": _http,
}


def build_client(profile: Profile, credential: str | None, state_dir: Path) -> Provider:
    """The adapter of `profile`'s kind, built with `credential` (None: the profile needs
    none). Raises `ProviderConfigError` when a kind that needs a credential has none, or the
    profile or credential does not fit the adapter."""
    return ADAPTERS[profile.kind](profile, credential, state_dir)


def refuse_record(profile: Profile, record: RecordPaths) -> None:
    """Raise `InvalidInput` when the adapter of `profile`'s kind would write a file a person
    named onto the installation's `record` (only the fake writes files:
    `episodic.providers.fake.refuse_record`)."""
    if profile.kind == "fake":
        from episodic.providers.fake import refuse_record as fake_refuse_record

        fake_refuse_record(record)


def _needed(profile: Profile, credential: str | None) -> str:
    if credential is None:
        raise ProviderConfigError(f"{profile.kind} profile {profile.id!r} needs a credential")
    return credential
