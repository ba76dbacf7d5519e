"""`--only`: which videos of a plan a run works (docs/cli.md "Selecting videos").

A selection is a comma-separated list of video ids (`v03,v05`), 1-based positions (`3`) and
ranges of positions (`2-4`), mixed as wanted. A chunk of digits is a position (a video whose
id is all digits is selected by its position); anything else is a video id, exactly.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence

from episodic.core.errors import InvalidInput
from episodic.core.ids import shown

_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+))?")
_SHOWN_IDS = 6  # the valid ids an error lists: the first few and the last
MAX_SELECTION_CHARS = 10_000


def _valid(ids: Sequence[str]) -> str:
    count = len(ids)
    positions = f"positions 1-{count}" if count > 1 else "position 1"
    if not ids or not any(ids):
        return f"the playlist has videos 1-{count}"
    listed = (
        ", ".join(ids)
        if count <= _SHOWN_IDS
        else f"{', '.join(ids[: _SHOWN_IDS - 1])}, ..., {ids[-1]}"
    )
    return f"the playlist has videos 1-{count} ({positions}, or ids {listed})"


def parse_selection(text: str, videos: int | Sequence[str]) -> frozenset[int]:
    """'3,7-9' -> {3, 7, 8, 9}; 'v03,v05' -> {3, 5}: the 1-based positions of the chosen
    videos. `videos`: the plan's video ids in order (or only their count: positions only).
    Raises `InvalidInput`: a reversed range says so, an unknown id names the close ones."""
    if not text.strip():  # `--only "$PICK"` with PICK unset: never "every video"
        raise InvalidInput(
            "invalid --only '': it is empty; name videos (v03,v05), positions (3) or ranges "
            "(7-9), or leave --only out for every video"
        )
    ids: Sequence[str] = [""] * videos if isinstance(videos, int) else list(videos)
    count = len(ids)
    position_of = {video_id: n for n, video_id in enumerate(ids, start=1) if video_id}
    if len(text) > MAX_SELECTION_CHARS:
        raise InvalidInput(
            f"invalid --only {shown(text)}: at most {MAX_SELECTION_CHARS} characters"
        )
    chosen: set[int] = set()
    for raw in text.split(","):
        chunk = raw.strip()
        if chunk in position_of and not chunk.isdigit():
            chosen.add(position_of[chunk])
            continue
        match = _RANGE.fullmatch(chunk)
        if match is None:
            if not chunk:
                raise InvalidInput(
                    f"invalid --only {shown(text)}: an empty entry; expected e.g. 3,7-9 or v03,v05"
                )
            close = difflib.get_close_matches(chunk, list(position_of), n=3, cutoff=0.6)
            near = f" (close: {', '.join(close)})" if close else ""
            raise InvalidInput(
                f"invalid --only {shown(text)}: no video {shown(chunk)}{near}; {_valid(ids)}"
            )
        low = int(match[1])
        high = int(match[2] or low)
        if match[2] is not None and high < low:
            raise InvalidInput(
                f"invalid --only {shown(text)}: range {low}-{high} is reversed: write {high}-{low}"
            )
        if low < 1 or high > count:
            what = f"{low}-{high}" if match[2] is not None else str(low)
            raise InvalidInput(f"invalid --only {shown(text)}: no video {what}; {_valid(ids)}")
        chosen.update(range(low, high + 1))
    return frozenset(chosen)
