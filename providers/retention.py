"""How long each kind of provider documents it keeps an accepted job's output collectable.

Replicate removes an API prediction's inputs, outputs and files an hour after it is made
(https://replicate.com/docs/topics/predictions/data-retention); fal keeps a request's result
an hour after it completes (https://fal.ai/docs/inference-api/queue/result) and its media as
the request's ``X-Fal-Object-Lifecycle-Preference`` says
(https://fal.ai/docs/model-apis/data-retention). The fake and the ``http`` protocol document
no limit. `episodic runs show` of a paused run says until when its accepted jobs can still be
collected; past it the provider proves them gone (`episodic.providers.base.OutputGone`).
"""

from __future__ import annotations

from episodic.providers.profiles import Profile

# seconds from the job's creation (fal counts from completion, which is later: a lower bound)
_OUTPUT_RETENTION_S = {"replicate": 3600, "fal": 3600}


def output_retention_s(profile: Profile) -> int | None:
    """Seconds an accepted job of `profile` stays collectable, or None (no documented limit)."""
    return _OUTPUT_RETENTION_S.get(profile.kind)
