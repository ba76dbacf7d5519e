"""Allocation keys: the stable identity of one logical invocation (DESIGN section 3).

Every retry of one invocation must produce the same key, so a key is built only from facts
that survive retries: the deployment and its scheduled slot for scheduler-created runs, the
flow run id for manual runs. A retry's timestamp or a random value would defeat it, and
outside a flow run there is no identity at all: that is an error, never "now".
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from core.errors import InvalidInput, NoInvocationIdentity

MAX_KEY_LENGTH = 512


@dataclass(frozen=True, slots=True)
class Invocation:
    """What the orchestrator tells us about the run that is asking for an episode."""

    flow_name: str
    flow_run_id: str
    deployment_name: str | None
    auto_scheduled: bool
    expected_start_time: datetime | None


def validate_key(key: str) -> str:
    """Check an explicit allocation key given from outside (CLI, flow parameter)."""
    if not isinstance(key, str) or not key.strip():
        raise InvalidInput("allocation key must be a non-empty string")
    if key != key.strip():
        raise InvalidInput("allocation key must not start or end with whitespace")
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidInput(f"allocation key is longer than {MAX_KEY_LENGTH} characters")
    if not key.isprintable():
        raise InvalidInput("allocation key contains control characters")
    return key


def utc_iso(moment: datetime) -> str:
    """Canonical UTC ISO-8601 with seconds precision and a ``Z`` suffix."""
    if moment.tzinfo is None:
        raise InvalidInput(f"naive datetime has no defined UTC instant: {moment.isoformat()}")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S") + (
        f".{moment.microsecond:06d}Z" if moment.microsecond else "Z"
    )


def derive_allocation_key(invocation: Invocation | None, explicit: str | None = None) -> str:
    """The allocation key of an invocation; an explicit key always wins."""
    if explicit is not None:
        return validate_key(explicit)
    if invocation is None:
        raise NoInvocationIdentity(
            "no flow run: outside a flow run there is no invocation identity; "
            "pass an explicit allocation key"
        )
    if invocation.auto_scheduled and invocation.deployment_name:
        if invocation.expected_start_time is None:
            raise NoInvocationIdentity("scheduled flow run has no scheduled start time")
        slot = utc_iso(invocation.expected_start_time)
        return f"scheduled:{invocation.flow_name}/{invocation.deployment_name}:{slot}"
    return f"flow-run:{invocation.flow_run_id}"
