"""A create the provider refused for now, waited out; one never sent, tried again.

Every new paid call goes through this one throttle: a claim's first create and a further
attempt's (a re-buy, an operator's ``--force-resubmit``) are refused while the profile is held
(`storage.claims`, `storage.leases.LeaseStore.new_attempt`) and wait for its moment
(`wait_until`); an unknown outcome's create sent again under its key waits for it first
(`wait_for_hold`) and waits out its own throttle the same way (`wait_out`).

Only what provably created nothing is sent again (`send`), each try after a check that the
claim still holds (a cancel or a lost lease during a wait is `Stopped`):

- a create never sent (a refused connection: `TransientProviderError`), up to
  `NOT_SENT_TRIES` times in all, after a short backoff;
- a create the provider throttled (429, or 503 with ``Retry-After``: `RateLimited`, nothing
  made) after the wait it asked for (its ``Retry-After``; without one, a backoff), at most
  `MAX_RETRY_AFTER_S` per wait. The moment is recorded for the profile
  (`episodic.storage.throttles`): every claim of a new paid call of it, in every run, process and
  machine, is refused ``throttled`` until then, so the workers of one account wait together
  (and a later moment another worker recorded is waited for too).

A throttle past the bound (one wait longer than `MAX_RETRY_AFTER_S`, or `THROTTLE_PATIENCE_S`
of waits for one call) raises `Throttled` at once, nothing waited: the caller withdraws the
intent (nothing paid), puts the item back as pending and pauses the run
(`core.runs.THROTTLE_STOPPED`) with the provider's words and the moment it takes calls again.
That moment is recorded for the profile as the provider gave it (at most `MAX_HOLD_S` ahead),
so a `generate`, `retry` or `runs resume` inside it pauses at its first claim (`held_too_long`,
`episodic.pipeline.item_claims`) and sends nothing.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from datetime import datetime, timedelta

from episodic.core.runs import THROTTLE_STOPPED
from episodic.providers.base import RateLimited, Stopped, TransientProviderError
from episodic.providers.replies import MAX_RETRY_AFTER_S
from episodic.storage.base import utcnow
from episodic.storage.throttles import ThrottleStore

# Waits for one create the provider refused for now, in all, before the run is paused
# instead (seconds); each wait is at most `MAX_RETRY_AFTER_S`.
THROTTLE_PATIENCE_S = 300.0
# The latest moment a provider's ``Retry-After`` is recorded for (seconds ahead): the
# profile takes no new paid call before it, in any process; a value further off (a date
# years ahead, a typo) holds a day, then the provider is asked again.
MAX_HOLD_S = 86_400.0
# Tries of a create that provably was never sent (a refused connection), in all.
NOT_SENT_TRIES = 4


class Throttled(Exception):
    """The provider's throttle outlasts the bound: nothing was sent for this intent; the
    run pauses with the message, as `flavour` says."""

    flavour = THROTTLE_STOPPED


def send(
    call: Callable[[], str],
    still_holds: Callable[[], bool],
    stop: threading.Event,
    profile_id: str,
    throttles: ThrottleStore | None,
) -> str:
    """`call` (a create), sent again only as the module docstring says; its answer."""
    not_sent = throttled = 0
    waited = 0.0
    while True:
        if stop.is_set() or ((not_sent or throttled) and not still_holds()):
            raise Stopped()
        try:
            return call()
        except RateLimited as exc:
            throttled += 1
            waited += wait_out(exc, throttled, waited, stop, profile_id, throttles)
        except TransientProviderError:
            not_sent += 1
            if not_sent >= NOT_SENT_TRIES:
                raise
            if stop.wait(_backoff(not_sent)):
                raise Stopped() from None


def _backoff(tries: int, cap: float = 2.0) -> float:
    """Exponential backoff with jitter after `tries` tries in a row, at most `cap` seconds."""
    return float(min(cap, 0.05 * 2 ** min(tries, 16) + random.uniform(0, 0.05)))


def wait_out(
    exc: RateLimited,
    throttled: int,
    waited: float,
    stop: threading.Event,
    profile_id: str,
    throttles: ThrottleStore | None,
) -> float:
    """Wait out a throttle: the provider's ``Retry-After`` (else a backoff), recorded for
    the profile so no claim of a new paid call of it is made before then in any process
    (`episodic.storage.throttles`; a later moment another worker recorded is waited for too).
    Returns the seconds waited; raises `Throttled` (nothing waited) when the provider
    asks for more than `MAX_RETRY_AFTER_S` or the waits would pass `THROTTLE_PATIENCE_S`,
    and `Stopped` when the run stops meanwhile."""
    asked = exc.retry_after_s
    seconds = asked if asked is not None else _backoff(throttled, cap=MAX_RETRY_AFTER_S)
    # The provider's own moment is recorded, however far past one wait's bound (at most
    # `MAX_HOLD_S`): every claim of the profile until then is refused, in every process, so
    # a later command sends no create inside the window the provider asked for.
    own = utcnow() + timedelta(seconds=min(seconds, MAX_HOLD_S))
    until = own
    if throttles is not None:
        until = throttles.hold(profile_id, own, exc.detail or str(exc))
    # a later moment another worker recorded is not what this answer asked for
    said_asked = asked if until <= own else None
    return wait_until(until, exc.detail or str(exc), waited, stop, profile_id, asked=said_asked)


def wait_until(
    until: datetime,
    said: str,
    waited: float,
    stop: threading.Event,
    profile_id: str,
    *,
    asked: float | None = None,
) -> float:
    """Wait until `until`, the moment the profile takes new paid calls again (the provider's
    words: `said`), after `waited` seconds of waits for the same call. Returns the seconds
    waited; raises `Throttled` (nothing waited) past the bounds of the module docstring, and
    `Stopped` when the run stops meanwhile. `asked`: the seconds the provider's
    ``Retry-After`` asked for, when it did (it may be more than `MAX_HOLD_S`, which `until`
    is not)."""
    left = max(0.0, (until - utcnow()).total_seconds())
    if left > MAX_RETRY_AFTER_S or waited + left > THROTTLE_PATIENCE_S:
        raise Throttled(throttle_text(profile_id, said, until, waited, asked=asked)) from None
    if stop.wait(left):
        raise Stopped() from None
    return left


def wait_for_hold(
    throttles: ThrottleStore | None, profile_id: str, waited: float, stop: threading.Event
) -> float:
    """Before a paid call that no claim checked (an unknown outcome's create sent again):
    wait out the throttle any worker recorded for the profile, as `wait_until`; 0 when
    there is none."""
    held = None if throttles is None else throttles.holding(profile_id)
    return 0.0 if held is None else wait_until(held[0], held[1], waited, stop, profile_id)


def throttle_text(
    profile_id: str,
    said: str,
    until: datetime,
    waited: float = 0.0,
    *,
    asked: float | None = None,
) -> str:
    """Why the run pauses at a throttle: the provider's words, what this answer asked for
    (`asked` seconds, when its ``Retry-After`` set `until`; None: `until` is a throttle
    recorded earlier, by this or another worker), and when new paid calls go again. A wait
    asked beyond `MAX_HOLD_S` is said as asked, and the moment given is when episodic asks
    again, not one the provider named."""
    left = max(0.0, (until - utcnow()).total_seconds())
    bound = (
        f"longer than the {MAX_RETRY_AFTER_S:g}s one wait is bound to"
        if left > MAX_RETRY_AFTER_S
        else f"after {waited:g}s of waits ({THROTTLE_PATIENCE_S:g}s in all is the bound)"
    )
    if asked is None:
        wait = f"the profile is held {_seconds(left)} more by a throttle recorded earlier"
        again = "no paid call of it is sent before "
    else:
        wait = f"it asked to wait {_seconds(asked)}"
        again = (
            f"episodic holds a throttle {MAX_HOLD_S:g}s at most and asks the provider again from "
            if asked > MAX_HOLD_S
            else "the provider takes calls again from "
        )
    return (
        f'provider profile {profile_id!r} throttled the run ("{said}"); {wait}, {bound}; '
        f"nothing was bought past it; {again}{until:%Y-%m-%d %H:%M:%S} UTC"
    )[:1500]


def _seconds(value: float) -> str:
    """A wait as a person reads it: whole seconds, and the days of a long one."""
    whole = round(value)
    return f"{whole:d}s" if whole < 2 * 86_400 else f"{whole:d}s (about {whole // 86_400:d} days)"


def held_too_long(until: datetime) -> bool:
    """A throttle recorded for the profile ends later than one wait is bound to: a claim
    that meets it pauses its run instead of waiting (`episodic.pipeline.item_claims`)."""
    return (until - utcnow()).total_seconds() > MAX_RETRY_AFTER_S
