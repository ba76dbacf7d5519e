"""Provider credentials from Prefect: a profile's Secret block, or its environment variable.

`PrefectSecretCredentials` is what flows and tasks use (a Prefect API is always there).
`CommandLineCredentials` is what every CLI command that reads a credential uses: the
environment variable when the profile names one, else its Secret block read through the
Prefect API the environment configures (``PREFECT_API_URL``). Without one, it refuses in one
line (exit 2) rather than start a temporary Prefect server to look in an empty database.
"""

from __future__ import annotations

import os

from episodic.core.errors import EpisodicError, ProviderConfigError
from episodic.providers.profiles import Profile


class PrefectUnreachable(EpisodicError):
    """The Prefect API did not answer a Secret block read (exit 1: no answer)."""


class PrefectSecretCredentials:
    """Reads a profile's Prefect Secret block, or its environment variable."""

    def read(self, profile: Profile) -> str:
        if profile.credential_secret_block:
            return read_secret_block(profile)
        from episodic.pipeline.gate import EnvironmentCredentials

        return EnvironmentCredentials().read(profile)


class CommandLineCredentials:
    """A command line's credential source: ``credential_env`` when the profile names one
    (and no Secret block is reachable), else its Secret block through ``PREFECT_API_URL``;
    a Secret block without a configured Prefect API is refused (`ProviderConfigError`) with
    how to configure one."""

    def read(self, profile: Profile) -> str:
        from episodic.pipeline.gate import EnvironmentCredentials

        block = profile.credential_secret_block
        if block and os.environ.get("PREFECT_API_URL"):
            return read_secret_block(profile)
        if profile.credential_env is not None:
            return EnvironmentCredentials().read(profile)
        if block:
            raise ProviderConfigError(
                f"credential for profile {profile.id!r}: its Secret block {block!r} is read "
                "through a Prefect API, and none is configured: export "
                "PREFECT_API_URL=http://127.0.0.1:4200/api (your `prefect server start`), or "
                "give the profile credential_env"
            )
        raise ProviderConfigError(
            f"profile {profile.id!r} names no credential_env or credential_secret_block"
        )


def read_secret_block(profile: Profile) -> str:
    """The value of the profile's Secret block, from the configured Prefect API: a block that
    does not exist is `ProviderConfigError` (exit 2), an API that does not answer
    `PrefectUnreachable` (exit 1). The value is never echoed."""
    import httpx
    from prefect.blocks.system import Secret

    from episodic.pipeline.gate import check_credential

    block = profile.credential_secret_block
    assert block is not None
    try:
        secret: Secret[str] = Secret.load(block)  # type: ignore[assignment]
        value = secret.get()
    except (httpx.HTTPError, RuntimeError, OSError) as exc:
        raise PrefectUnreachable(
            f"credential for profile {profile.id!r}: the Prefect API did not answer reading "
            f"Secret block {block!r} ({type(exc).__name__})"
        ) from None
    except ValueError:  # Prefect: "Unable to find block document named ..."
        raise ProviderConfigError(
            f"credential for profile {profile.id!r}: no Secret block {block!r} at the Prefect "
            f"API (make one: `prefect block create secret`, or in Python "
            f'Secret(value="...").save("{block}"))'
        ) from None
    return check_credential(profile, str(value), f"Secret block {block!r}")
