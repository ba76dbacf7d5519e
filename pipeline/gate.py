"""The execution gate: no paid command reads a credential or builds a provider
client for an episode that does not exist.

The order is structural: `build_provider` accepts only a `GatePass`, and only `open_gate`
can make one (after parsing the id and loading the episode). The one other caller of
`providers.adapters.build_client` is ``episodic providers check``, which builds a client for
a free call and never calls what spends (`episodic.pipeline.provider_check`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Protocol

from sqlalchemy import Engine

from episodic.core.episodes import Episode
from episodic.core.errors import ProviderConfigError
from episodic.core.ids import EpisodeId
from episodic.core.output_files import RecordPaths
from episodic.core.settings import Settings
from episodic.providers.adapters import build_client, refuse_record
from episodic.providers.base import Provider
from episodic.providers.profiles import Profile
from episodic.storage.episodes import EpisodeRepository

_GATE_TOKEN = object()
PAID_COMMANDS = frozenset({"generate", "retry", "resume"})


@dataclass(frozen=True, slots=True)
class GatePass:
    """Proof that the episode exists and the command may run on it."""

    pipeline: str
    episode: Episode
    episode_pk: int
    command: str
    _token: object = field(repr=False, compare=False)

    @property
    def episode_id(self) -> str:
        return str(self.episode.episode_id)


def open_gate(engine: Engine, pipeline: str, episode_id: str, command: str) -> GatePass:
    """Parse the id (exit 2), load the episode (exit 5), check the command is allowed."""
    parsed = EpisodeId.parse(episode_id)
    episode, pk = EpisodeRepository(engine).locate(pipeline, parsed)
    return GatePass(pipeline, episode, pk, command, _GATE_TOKEN)


class CredentialSource(Protocol):
    def read(self, profile: Profile) -> str: ...


class EnvironmentCredentials:
    """Reads the environment variable a profile names; never logs or echoes the value."""

    def read(self, profile: Profile) -> str:
        name = profile.credential_env
        if name is None:
            raise ProviderConfigError(f"profile {profile.id!r} names no credential_env")
        value = os.environ.get(name)
        if not value:
            raise ProviderConfigError(f"credential for profile {profile.id!r}: ${name} is not set")
        return check_credential(profile, value, f"${name}")


def check_credential(profile: Profile, value: str, source: str) -> str:
    """A credential goes into an HTTP header: printable ASCII without spaces, or refused
    (naming where it came from, never echoing it)."""
    if not value.isascii() or not value.isprintable() or any(c.isspace() for c in value):
        raise ProviderConfigError(
            f"credential for profile {profile.id!r}: {source} must be printable ASCII "
            "without spaces (it is sent as an HTTP header)"
        )
    return value


def build_provider(
    gate: GatePass, profile: Profile, credentials: CredentialSource, settings: Settings
) -> Provider:
    """The client of a paid command: the credential is read, and the client built (by
    `episodic.providers.adapters.build_client`, the one place any client is built), only for the
    `GatePass` of an episode that exists. Raises `ProviderConfigError` (no credential, a
    profile the adapter cannot use), `InvalidInput` (the fake's job store or event log named
    onto the record of `settings`' installation: `episodic.providers.fake.refuse_record`) and
    `TypeError` without a real `GatePass`."""
    if not isinstance(gate, GatePass) or gate._token is not _GATE_TOKEN:
        raise TypeError("build_provider needs the GatePass of a successful open_gate()")
    refuse_record(profile, RecordPaths.of(settings, state_folder=False))
    credential = credentials.read(profile) if profile.needs_credential else None
    if profile.kind == "http" and credential is not None and profile.base_url is None:
        # a paid command's own words (`providers check` says the adapter's "needs base_url")
        raise ProviderConfigError(f"http profile {profile.id!r} needs base_url and a credential")
    return build_client(profile, credential, settings.home_path)
