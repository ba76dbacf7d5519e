"""Provider credentials from Prefect: a profile's Secret block, or its environment variable."""

from __future__ import annotations

from providers.profiles import Profile


class PrefectSecretCredentials:
    """Reads a profile's Prefect Secret block, or its environment variable."""

    def read(self, profile: Profile) -> str:
        if profile.credential_secret_block:
            from prefect.blocks.system import Secret

            from pipeline.gate import check_credential

            secret: Secret[str] = Secret.load(profile.credential_secret_block)  # type: ignore[assignment]
            return check_credential(
                profile, str(secret.get()), f"Secret block {profile.credential_secret_block!r}"
            )
        from pipeline.gate import EnvironmentCredentials

        return EnvironmentCredentials().read(profile)
