"""ISO week ids and episode ids, parsed strictly.

An episode id names a directory on disk, so the strict parse here is also the path-traversal
guard: anything that is not exactly ``YYYY-Www-N`` (week valid for its ISO year, ``N`` without
leading zeros) is refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta, tzinfo

from episodic.core.errors import InvalidEpisodeId, InvalidInput, InvalidWeekId

# ASCII digits only: `\d` would also accept other scripts' digits.
_WEEK_RE = re.compile(r"([0-9]{4})-W([0-9]{2})")
_EPISODE_RE = re.compile(r"([0-9]{4})-W([0-9]{2})-(0|[1-9][0-9]{0,9})")
MAX_SEQUENCE = 2**31 - 1  # fits a 32-bit integer column on every backend


def weeks_in_iso_year(year: int) -> int:
    """52 or 53: December 28th always lies in the last ISO week of its year."""
    return date(year, 12, 28).isocalendar().week


def shown(text: object, limit: int = 64) -> str:
    """`text` quoted for an error message, clipped to `limit` characters (an id pasted by
    mistake may be kilobytes long; the message stays one short line)."""
    quoted = repr(text)
    return quoted if len(quoted) <= limit else f"{quoted[: limit - 1]}… ({len(str(text))} chars)"


@dataclass(frozen=True, order=True, slots=True)
class WeekId:
    year: int
    week: int

    def __post_init__(self) -> None:
        if not 1 <= self.year <= 9999:
            raise InvalidWeekId(f"ISO year {self.year} is out of range")
        if not 1 <= self.week <= weeks_in_iso_year(self.year):
            raise InvalidWeekId(
                f"{self.year} has {weeks_in_iso_year(self.year)} ISO weeks, not week {self.week}"
            )

    @classmethod
    def parse(cls, text: str) -> WeekId:
        match = _WEEK_RE.fullmatch(text) if isinstance(text, str) else None
        if match is None:
            raise InvalidWeekId(f"invalid week id {shown(text)}: expected YYYY-Www, e.g. 2026-W32")
        return cls(int(match[1]), int(match[2]))

    @classmethod
    def of(cls, moment: datetime, tz: tzinfo) -> WeekId:
        """The ISO week containing ``moment`` as seen on a wall clock in ``tz``.

        Naive datetimes are refused: their week is ambiguous. Raises `InvalidWeekId` (exit 2)
        for a naive moment or one outside the years 1-9999 once seen in `tz`.
        """
        if moment.tzinfo is None or moment.utcoffset() is None:
            raise InvalidWeekId(f"a moment needs a timezone to have a week: {moment.isoformat()}")
        try:
            iso = moment.astimezone(tz).isocalendar()
        except OverflowError:  # 9999-12-31T23:59-14:00 is year 10000 in UTC
            raise InvalidWeekId(
                f"{moment.isoformat()} is outside the years 1-9999 in {tz}"
            ) from None
        return cls(iso.year, iso.week)

    def monday(self) -> date:
        return date.fromisocalendar(self.year, self.week, 1)

    def next(self) -> WeekId:
        following = self.monday() + timedelta(weeks=1)
        iso = following.isocalendar()
        return WeekId(iso.year, iso.week)

    def __str__(self) -> str:
        return f"{self.year:04d}-W{self.week:02d}"


@dataclass(frozen=True, order=True, slots=True)
class EpisodeId:
    week: WeekId
    sequence: int

    def __post_init__(self) -> None:
        if not 0 <= self.sequence <= MAX_SEQUENCE:
            raise InvalidEpisodeId(f"sequence {self.sequence} is out of range")

    @classmethod
    def parse(cls, text: str) -> EpisodeId:
        match = _EPISODE_RE.fullmatch(text) if isinstance(text, str) else None
        if match is None:
            raise InvalidEpisodeId(
                f"invalid episode id {shown(text)}: expected YYYY-Www-N, e.g. 2026-W32-0"
            )
        try:
            week = WeekId(int(match[1]), int(match[2]))
        except InvalidWeekId as exc:
            raise InvalidEpisodeId(f"invalid episode id {shown(text)}: {exc}") from None
        return cls(week, int(match[3]))

    def __str__(self) -> str:
        return f"{self.week}-{self.sequence}"


def parse_run_id(text: str) -> str:
    """A run id as `episodic runs list` prints it (a UUID), in its canonical form.
    Raises `InvalidInput` (exit 2) for anything else, before the database is asked."""
    import uuid

    try:
        parsed = uuid.UUID(text) if isinstance(text, str) and len(text) <= 45 else None
    except ValueError:
        parsed = None
    if parsed is None:
        raise InvalidInput(
            f"invalid run id {shown(text)}: expected a run id from `episodic runs list`, "
            "e.g. 0d45478b-098c-4a4a-9a52-0d9ecb6a88ed"
        )
    return str(parsed)


RUN_PREFIX_MIN = 4  # characters of a run id that name it, when no other run starts so
_UUID_SHAPE = "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
_HEX = frozenset("0123456789abcdef")


def parse_run_ref(text: str) -> tuple[str, bool]:
    """A run id or a prefix of one, as typed: (canonical id, False) for a whole run id, or
    (lowercase prefix, True) for its first `RUN_PREFIX_MIN`+ characters (hex digits, and
    '-' where the id has them). Raises `InvalidInput` (exit 2) for anything else."""
    if isinstance(text, str) and RUN_PREFIX_MIN <= len(text) < len(_UUID_SHAPE):
        prefix = text.lower()
        if all(
            (c == "-") if shape == "-" else (c in _HEX)
            for c, shape in zip(prefix, _UUID_SHAPE, strict=False)
        ):
            return prefix, True
    try:
        return parse_run_id(text), False
    except InvalidInput:
        raise InvalidInput(
            f"invalid run id {shown(text)}: expected a run id from `episodic runs list` or its "
            f"first {RUN_PREFIX_MIN} or more characters, e.g. 0d45478b"
        ) from None
