"""Request fingerprints for dispatch dedup. Pure functions, no I/O.

Every way of starting work (CLI, Python API, Prefect flows, `episodic dispatch`) describes its
request as a `RunRequest`. Its *fingerprint* names "the same request": the caller's explicit
idempotency key (scoped to the pipeline), or else a digest of pipeline, episode, command and
the canonical parameters that say *what* is done (not how fast: concurrency is left out), plus
the batch id when one is given. `request_sha256` digests the parameters alone, so an explicit
key sent again with other parameters is recognised and refused.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from episodic.core.errors import InvalidInput

_KEY_RE = re.compile(r"[\x21-\x7e]{1,255}")  # printable ASCII, no spaces (an HTTP header value)
_BATCH_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")


def parse_idempotency_key(value: str | None) -> str | None:
    """An explicit idempotency key: 1-255 printable ASCII characters without spaces."""
    if value is None:
        return None
    if not isinstance(value, str) or not _KEY_RE.fullmatch(value):
        raise InvalidInput(
            "invalid idempotency key: use 1-255 printable ASCII characters without spaces"
        )
    return value


def parse_batch_id(value: str | None) -> str | None:
    """A batch id: 1-64 of A-Z a-z 0-9 . _ : - starting with a letter or digit."""
    if value is None:
        return None
    if not isinstance(value, str) or not _BATCH_RE.fullmatch(value):
        raise InvalidInput(
            "invalid batch id: use 1-64 of A-Z a-z 0-9 . _ : - starting with a letter or digit"
        )
    return value


def check_dedup_options(
    idempotency_key: str | None, batch_id: str | None, allow_duplicate: bool
) -> None:
    """Validate the dedup options together: an explicit key names one request, so it cannot
    be combined with an opt-out (`--batch-id`, `--allow-duplicate`). Raises `InvalidInput`."""
    parse_idempotency_key(idempotency_key)
    parse_batch_id(batch_id)
    if idempotency_key is not None and (batch_id is not None or allow_duplicate):
        raise InvalidInput(
            "--idempotency-key names one request: do not combine it with --batch-id or "
            "--allow-duplicate"
        )


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, ASCII only; floats are refused (money is integral)."""

    def check(v: Any) -> None:
        if isinstance(v, float):
            raise InvalidInput("request parameters must not contain floats")
        if isinstance(v, dict):
            for item in v.values():
                check(item)
        elif isinstance(v, list | tuple):
            for item in v:
                check(item)

    check(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _sha256(*parts: str) -> str:
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class RunRequest:
    """What a caller asks for, as dedup sees it.

    `params` holds only what defines the work (selection, retry budget, cost caps, provider
    profile, plan digest), as JSON-able ints, strings, bools, lists and None.
    """

    pipeline: str
    episode_id: str
    command: str
    params: dict[str, Any] = field(default_factory=dict)
    idempotency_key: str | None = None
    batch_id: str | None = None
    allow_duplicate: bool = False

    @property
    def request_sha256(self) -> str:
        body = {"params": self.params, "batch_id": self.batch_id}
        return _sha256(self.pipeline, self.episode_id, self.command, canonical_json(body))

    @property
    def fingerprint(self) -> str:
        if self.idempotency_key is not None:
            return _sha256("key", self.pipeline, self.idempotency_key)
        return _sha256("soft", self.request_sha256)


@dataclass(frozen=True, slots=True)
class Admission:
    """The choke point's answer: the run to work on, and whether it already existed.

    `run_id` is None when there was nothing to do and no run was created.
    """

    run_id: str | None
    deduplicated: bool = False
    created: bool = False
    taken_over: bool = False  # the same request's run whose process died: continued here
    fingerprint: str | None = None
    plan_id: int | None = None  # the recorded plan the run is for (recorded here if new)

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "deduplicated": self.deduplicated,
            "taken_over": self.taken_over,
        }
