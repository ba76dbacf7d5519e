"""The words of a paid call whose acceptance is unknown: why, and the way on.

The item's message begins with `UNKNOWN_TEXT` (the run's last line reads its next step from
it, `episodic.pipeline.outcomes`). The way on: the provider is asked again (a lookup, an idempotent
create) where it can settle it; otherwise, or when a lookup stays ambiguous, the operator
finds the job at the provider and adopts it (`episodic runs adopt`: verified there, pays
nothing); only a job that is not there is paid for again (``--force-resubmit``).
"""

from __future__ import annotations

from episodic.core.hints import hint
from episodic.core.runs import Claim
from episodic.providers.base import DescribesJobs, ImageRequest, Provider

UNKNOWN_TEXT = "acceptance unknown"


def unknown_text(
    provider: Provider,
    profile: str,
    episode_id: str,
    claim: Claim,
    request: ImageRequest,
    why: str,
) -> str:
    """The message of `claim`'s item whose call (`request`) may or may not have made a job."""
    caps = provider.capabilities
    run = claim.run_id
    adopt = (
        f"`episodic runs adopt {run} {claim.item.item_id} --job ID` (verified at the "
        "provider, pays nothing)"
    )
    where = (  # a provider whose jobs carry no reference of ours says where to look
        provider.how_to_find(request)
        if isinstance(provider, DescribesJobs)
        else f"client reference {request.client_reference}"
    )
    resubmit = f"only if it is not there: `episodic runs resume {run} --force-resubmit`"
    if caps.can_lookup or caps.idempotent_create:
        if "ambiguous" in why:  # asking again lists the same jobs: the operator chooses
            return (
                f"{UNKNOWN_TEXT} ({why}); not resubmitted: find yours ({where}) and adopt "
                f"it: {adopt}"
            )
        again = hint(
            f"`episodic runs resume {run}`",
            f"running the generate deployment again for {episode_id}",
        )
        return (
            f"{UNKNOWN_TEXT} ({why}); not resubmitted: {again} asks the provider again; or "
            f"find {where} at the provider and adopt it: {adopt}; {resubmit}"
        )
    return (
        f"{UNKNOWN_TEXT} ({why}); provider profile {profile!r} can neither look jobs up nor "
        f"dedupe creates: look for {where} at the provider and adopt it: {adopt}; {resubmit}"
    )
