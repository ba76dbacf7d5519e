"""Allocation keys: the stable identity of one logical invocation.

Every retry of one invocation must produce the same key, so a key is built only from facts
that survive retries: the pipeline and its scheduled slot for scheduler-created runs, the
flow run id for manual runs. A retry's timestamp or a random value would defeat it, and
outside a flow run there is no identity at all: that is an error, never "now".

A slot belongs to the pipeline, not to the deployment that carries its schedule:
``slot:{pipeline}:{scheduled start, UTC}``. Two deployments of the weekly flow scheduling one
pipeline at the same moment (a copy, a renamed one left behind) ask for the same episode.
Keys of slots allocated before this format, ``scheduled:{flow}/{deployment}:{slot}``, are
still read (`SlotKey.parse`): allocating a slot also finds an episode of the same pipeline
whose old key names the same moment (storage.allocator).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from episodic.core.errors import InvalidInput, NoInvocationIdentity
from episodic.core.settings import validate_pipeline

MAX_KEY_LENGTH = 512
MIN_SLOT_YEAR, MAX_SLOT_YEAR = 1970, 9998  # a slot's ISO week must exist on both sides
SLOT_PREFIX = "slot:"
# scheduled:{flow}/{deployment}:{slot}: slots allocated before a slot belonged to its pipeline
LEGACY_SLOT_PREFIX = "scheduled:"
_UTC_ISO = r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{6})?Z"
# A slot key names a whole second, in exactly one spelling (`utc_iso` of a whole second):
# `…T08:00:00.000000Z` would be a second key, and so a second episode, for the same slot.
_SLOT_SECOND = r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z"
_SLOT_RE = re.compile(
    rf"slot:(?P<pipeline>[a-z0-9][a-z0-9_.-]{{0,62}}):(?P<slot>{_SLOT_SECOND})", re.ASCII
)
_LEGACY_RE = re.compile(rf"scheduled:(?P<deployment>.+/.+):(?P<slot>{_UTC_ISO})", re.ASCII)


@dataclass(frozen=True, slots=True)
class Invocation:
    """What the orchestrator tells us about the run that is asking for an episode."""

    flow_name: str
    flow_run_id: str
    deployment_name: str | None
    auto_scheduled: bool
    expected_start_time: datetime | None


@dataclass(frozen=True, slots=True)
class SlotKey:
    """A scheduled slot named by an allocation key: the moment (canonical UTC, `utc_iso`)
    and, for today's keys, its pipeline; for keys of the old format, the deployment."""

    slot: str
    pipeline: str | None = None  # slot:{pipeline}:{slot}
    deployment: str | None = None  # scheduled:{flow}/{deployment}:{slot} (old format)

    @classmethod
    def parse(cls, key: str) -> SlotKey | None:
        """The slot a key names, or None for any other key (manual runs, explicit keys)."""
        if match := _SLOT_RE.fullmatch(key):
            return cls(match["slot"], pipeline=match["pipeline"])
        if match := _LEGACY_RE.fullmatch(key):
            return cls(match["slot"], deployment=match["deployment"])
        return None

    @property
    def moment(self) -> datetime:
        return datetime.fromisoformat(self.slot)

    @property
    def legacy_pattern(self) -> str:
        """A SQL LIKE pattern (escape ``\\``) matching old-format keys of this slot."""
        escaped = re.sub(r"([\\%_])", r"\\\1", self.slot)
        return f"{LEGACY_SLOT_PREFIX}%:{escaped}"


def slot_key(pipeline: str, moment: datetime) -> str:
    """The allocation key of a pipeline's scheduled slot, whichever deployment carries it.
    Raises `InvalidInput` for a moment that is not a whole second (no schedule makes one)."""
    if moment.microsecond:
        raise InvalidInput(f"slot {moment.isoformat()} is not a whole second")
    return f"{SLOT_PREFIX}{validate_pipeline(pipeline)}:{utc_iso(moment)}"


def parse_slot(value: str) -> datetime:
    """A slot given from outside (``--slot``): an ISO-8601 moment with its UTC offset."""
    try:
        moment = datetime.fromisoformat(value)
    except (TypeError, ValueError):
        raise InvalidInput(
            f"slot {value!r} is not an ISO-8601 date-time (e.g. 2026-08-06T09:00:00+02:00)"
        ) from None
    if moment.tzinfo is None:
        raise InvalidInput(f"slot {value!r} has no UTC offset (e.g. +02:00 or Z)")
    if moment.microsecond:
        raise InvalidInput(f"slot {value!r} is not a whole second (a schedule's slots are)")
    try:
        year = moment.astimezone(UTC).year
    except OverflowError:
        year = 0
    if not MIN_SLOT_YEAR <= year <= MAX_SLOT_YEAR:
        raise InvalidInput(
            f"slot {value!r} is outside the years {MIN_SLOT_YEAR}-{MAX_SLOT_YEAR} (UTC)"
        )
    return moment


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
    if key.startswith(SLOT_PREFIX) and SlotKey.parse(key) is None:
        raise InvalidInput(  # a near miss would own a second episode for the same slot
            f"allocation key {key!r} is not a slot key: slot:{{pipeline}}:{{start in UTC}}, "
            "e.g. slot:weekly:2026-08-06T07:00:00Z (`episodic replay --slot` builds it)"
        )
    return key


def utc_iso(moment: datetime) -> str:
    """Canonical UTC ISO-8601 with seconds precision and a ``Z`` suffix."""
    if moment.tzinfo is None:
        raise InvalidInput(f"naive datetime has no defined UTC instant: {moment.isoformat()}")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S") + (
        f".{moment.microsecond:06d}Z" if moment.microsecond else "Z"
    )


def derive_allocation_key(
    invocation: Invocation | None, explicit: str | None = None, *, pipeline: str
) -> str:
    """The allocation key of an invocation of ``pipeline``; an explicit key always wins."""
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
        # A schedule's slots are whole seconds; a sub-second start (no cron makes one) is
        # the same slot as its second.
        start = invocation.expected_start_time
        return slot_key(pipeline, start - timedelta(microseconds=start.microsecond))
    return f"flow-run:{invocation.flow_run_id}"
