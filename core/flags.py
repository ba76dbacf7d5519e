"""Boolean environment variables (EPISODIC_DEBUG): parsed as words, never by truthiness.

``EPISODIC_DEBUG=0`` is off. On: 1, true, yes, on; off: 0, false, no, off or empty (any
case, surrounding spaces ignored); unset is off. Anything else is off, with a warning the
caller prints (one line).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"", "0", "false", "no", "off"})


@dataclass(frozen=True, slots=True)
class Flag:
    on: bool
    warning: str | None = None  # the value was not a boolean word: it counts as off


def parse_flag(name: str, raw: str | None) -> Flag:
    """The flag `name` whose value is `raw` (None: unset)."""
    if raw is None:
        return Flag(False)
    word = raw.strip().lower()
    if word in TRUE_WORDS:
        return Flag(True)
    if word in FALSE_WORDS:
        return Flag(False)
    shown = (
        raw if len(raw) <= 20 and raw.isprintable() else raw[:20].encode("unicode_escape").decode()
    )
    return Flag(
        False,
        f"{name}={shown!r} is not a boolean (1/true/yes/on or 0/false/no/off): taken as off",
    )


def env_flag(name: str, environ: Mapping[str, str] | None = None) -> Flag:
    """The boolean environment variable `name` (see `parse_flag`)."""
    return parse_flag(name, (os.environ if environ is None else environ).get(name))
