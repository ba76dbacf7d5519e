"""Typed flow parameters: the Prefect UI shows their pattern and description, the server
validates deployment runs against them, and the flow re-validates (`validate_parameters`).

Descriptions come from each flow's Google-style ``Args:`` docstring section.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from pydantic import Field
from pydantic.fields import FieldInfo

from episodic.core.money import AMOUNT_PATTERN
from episodic.core.selection import MAX_SELECTION_CHARS

_WEEK = r"[0-9]{4}-W(0[1-9]|[1-4][0-9]|5[0-3])"  # W53 exists only in some years: parsed
EPISODE_ID_PATTERN = rf"^{_WEEK}-(0|[1-9][0-9]{{0,9}})$"
WEEK_PATTERN = rf"^{_WEEK}$"
PIPELINE_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,62}$"

EpisodeIdParam = Annotated[str, Field(pattern=EPISODE_ID_PATTERN, max_length=24)]
WeekParam = Annotated[str, Field(pattern=WEEK_PATTERN)] | None
PipelineParam = Annotated[str, Field(pattern=PIPELINE_PATTERN)] | None
# No control characters (a NUL, a newline, an escape sequence) in text that is stored, used
# as a path or shown: refused at the boundary, before the flow touches the database.
NO_CONTROL_PATTERN = r"^[^\x00-\x1f\x7f-\x9f]*$"
KeyParam = Annotated[str, Field(min_length=1, max_length=255, pattern=NO_CONTROL_PATTERN)] | None
Playlist = Annotated[str, Field(min_length=1, max_length=1024, pattern=NO_CONTROL_PATTERN)]
PlaylistParam = Playlist | None
# Numbers and switches are what they say: `true` is not 1, `1.5` or "4" is not 4, "yes" is
# not true (pydantic's lax mode would take them): integer parameters say `strict=True`.
Flag = Annotated[bool, Field(strict=True)]
# An amount as `parse_money` reads it: at most six decimals, surrounding spaces ignored.
AmountParam = Annotated[str, Field(pattern=rf"^\s*{AMOUNT_PATTERN}\s*$")] | None
SelectionParam = Annotated[str, Field(max_length=MAX_SELECTION_CHARS)] | None
APPROVAL_TIMEOUT_DEFAULT_S = 7 * 86_400
# Seconds an approval form waits for a decision before its run fails: 60 s to 90 days.
ApprovalTimeoutParam = Annotated[int, Field(ge=60, le=90 * 86_400, strict=True)]


def whole(bounds: tuple[int, int]) -> FieldInfo:
    """A whole-number parameter in `bounds` (inclusive), strictly an integer."""
    low, high = bounds
    field: FieldInfo = Field(ge=low, le=high, strict=True)
    return field


def episode_run_name(verb: str) -> Callable[[], str]:
    """A `flow_run_name` callable: ``"{verb} {episode_id}"`` from the run's parameters, so the
    UI's run list reads like the ledger (``generate 2026-W32-1``)."""

    def name() -> str:
        from prefect.runtime import flow_run

        return f"{verb} {flow_run.parameters.get('episode_id', '?')}"

    name.__name__ = f"{verb}_run_name"
    return name
