"""A paid call whose acceptance is unknown, settled without a new paid call as far as the
provider's promises go: a lookup by what we sent, or the same create sent again under the
same key where the provider honours idempotent creates (`resolve`).

A lookup never counts a job the ledger records for another submission (the same playlist in
two episodes sends the very same input); an ambiguity that remains is answered at once with
its candidates, for the operator to adopt one. A create sent again may still be the call that
makes the one job (the first never reached the provider), so it is a paid call like any
other: the claim is checked first, and it goes through the profile's one throttle
(`episodic.pipeline.throttle`): it waits for a throttle any worker recorded, and a 429 (or 503 with
``Retry-After``) it hears is waited out for the provider's ``Retry-After`` and recorded for
every worker of the profile, within the same bounds as a create's. A throttle past those
bounds leaves the call unknown (a resume asks again), with the provider's words.

A lookup that finds nothing yet (a listing may lag) and answers that settle nothing (an
unusable reply, a refused connection) are asked again after each of `RETRY_DELAYS_S`, then
the call stays unknown.
"""

from __future__ import annotations

import threading

from episodic.core.runs import Claim, Submission
from episodic.pipeline.throttle import Throttled, wait_for_hold, wait_out
from episodic.providers.base import (
    AmbiguousLookup,
    ImageRequest,
    Provider,
    ProviderError,
    RateLimited,
    Stopped,
    TransientProviderError,
    UnknownOutcome,
)
from episodic.storage.leases import LeaseStore
from episodic.storage.ledger import LedgerStore
from episodic.storage.throttles import ThrottleStore
from episodic.storage.tx import database_cause

# Seconds between tries whose answer settled nothing (not a throttle: that waits its own).
RETRY_DELAYS_S = (0.2, 0.5, 1.0)


def reason(exc: BaseException) -> str:
    """One line for the ledger and the run (a driver's message, not SQLAlchemy's wrapping
    with its statement and background link)."""
    cause = database_cause(exc)
    text = f"database error: {cause}" if cause is not None else str(exc)
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    return (line or type(exc).__name__)[:500]


def resolve(
    provider: Provider,
    ledger: LedgerStore,
    leases: LeaseStore,
    claim: Claim,
    submission: Submission,
    request: ImageRequest,
    stop: threading.Event,
    profile_id: str,
    throttles: ThrottleStore | None,
) -> tuple[str | None, str]:
    """(the job recorded as accepted for `submission`, or None; what the last try said, ""
    if nothing), as the module docstring says; `profile_id`'s throttle is the one waited
    for and recorded."""
    caps = provider.capabilities
    if not (caps.can_lookup or caps.idempotent_create):
        return None, ""
    looked = ""
    delays = iter(RETRY_DELAYS_S)
    throttled, waited = 0, 0.0

    def recorded(remote_ref: str) -> bool:
        return ledger.recorded_elsewhere(remote_ref, submission.pk)

    while not stop.is_set():
        try:
            try:
                remote_ref = None
                if caps.can_lookup:
                    remote_ref = provider.lookup(
                        submission.client_reference, request, recorded=recorded
                    )
                    looked = "" if remote_ref is not None else "lookup: no job of ours found"
                if remote_ref is None and caps.idempotent_create:
                    # the same create, same key: the provider returns the job it made, or
                    # makes the one job this submission stands for
                    if not leases.still_holds(claim):
                        return None, looked  # cancelled or taken over: it stays unknown, unsent
                    waited += wait_for_hold(throttles, profile_id, waited, stop)
                    remote_ref = provider.submit(request)
            except AmbiguousLookup as exc:  # asked again it lists the same jobs
                return None, reason(exc)
            except RateLimited as exc:  # nothing made by this one: its wait, for every worker
                throttled += 1
                looked = reason(exc)
                waited += wait_out(exc, throttled, waited, stop, profile_id, throttles)
                continue
            except (UnknownOutcome, TransientProviderError) as exc:
                looked = reason(exc)
                remote_ref = None
            except ProviderError as exc:  # refused or failed: it will not settle this way
                return None, reason(exc)
        except Throttled as exc:  # past the bound: unknown still, a resume asks again
            return None, str(exc)
        except Stopped:
            return None, looked
        if remote_ref is not None and ledger.accept(submission.pk, remote_ref):
            return remote_ref, ""
        if remote_ref is not None:  # another submission's job: never ours
            return None, f"the provider answered with job {remote_ref[:80]}, another's"
        delay = next(delays, None)  # none found yet (a listing may lag), or no usable answer
        if delay is None or stop.wait(delay):
            break
    return None, looked
