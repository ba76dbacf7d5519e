"""Global concurrency limits the flows rely on (one per provider profile)."""

from __future__ import annotations

from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import (
    GlobalConcurrencyLimitCreate,
    GlobalConcurrencyLimitUpdate,
)
from prefect.exceptions import ObjectNotFound

from tasks.generate import provider_limit_name


def ensure_provider_limit(profile_id: str, limit: int) -> str:
    """Create or update the provider's limit; paid tasks acquire it with strict=True."""
    name = provider_limit_name(profile_id)
    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            client.create_global_concurrency_limit(
                GlobalConcurrencyLimitCreate(name=name, limit=limit)
            )
        else:
            client.update_global_concurrency_limit(name, GlobalConcurrencyLimitUpdate(limit=limit))
    return name
