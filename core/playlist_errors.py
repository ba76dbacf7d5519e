"""A playlist's mistakes, all of them, in the project's own words (docs/playlist.md).

pydantic reports `items.0.title: Field required`; people read `video v01 (item 1): title is
missing`. Every mistake pydantic finds is translated, each naming its video by id (by its
position when the id itself is missing or bad), and duplicate video ids are found here too
(pydantic's check of them runs only once every field is valid).
"""

from __future__ import annotations

import difflib
import re
import reprlib
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_ID_RULE = "1 to 64 letters, digits, '_', '.' or '-', starting with a letter or digit"
# the fields each level of a playlist takes (unknown ones are named with the close matches)
FIELDS: dict[str, tuple[str, ...]] = {
    "playlist": (
        "template",
        "provider_profile",
        "reference_assets",
        "reference_image",
        "hero",
        "items",
    ),
    "template": ("id", "version", "prompt"),
    "video": ("video_id", "title", "parts", "seed", "hero"),
    "hero": ("candidates",),
}
_UNION_BRANCH = re.compile(r"^(literal\[.*\]|[A-Z]\w*|function-\w+\[.*\])$")
_MAX_SHOWN = 40


_REPR = reprlib.Repr()  # keyword arguments only from Python 3.12
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict = 2, 4, 4
_REPR.maxstring = _REPR.maxother = _MAX_SHOWN


def _shown(value: Any) -> str:
    """`value` in the file's words (YAML's empty, true and false), at most _MAX_SHOWN
    characters, built without walking all of a large value (`reprlib`: a document of
    aliases may repeat one list millions of times)."""
    if value is None:
        return "empty (nothing written)"
    if isinstance(value, bool):
        return "true" if value else "false"
    text = _REPR.repr(value)
    return text if len(text) <= _MAX_SHOWN else f"{text[: _MAX_SHOWN - 3]}..."


def _level(path: Sequence[str]) -> str:
    if not path:
        return "playlist"
    return {"template": "template", "hero": "hero"}.get(path[-1], "playlist")


def _unknown_field(name: str, level: str) -> str:
    known = FIELDS[level]
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    return f"{name} is not a field here ({hint}fields: {', '.join(known)})"


def _words(error: Mapping[str, Any], path: list[str], level: str) -> str:
    """One mistake in plain words; `path` is the field's place (items and union tags out)."""
    kind = error["type"]
    ctx = error.get("ctx") or {}
    field = ".".join(path) if path else "the playlist"
    value = error.get("input")
    if kind == "missing":
        return f"{field} is missing"
    if kind == "extra_forbidden":
        return _unknown_field(path[-1], _level(path[:-1]) if path[:-1] else level)
    if kind in ("string_type", "str_type"):
        return f"{field} must be text, not {_shown(value)}"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return f"{field} must be a whole number, not {_shown(value)}"
    if kind == "bool_type":
        return f"{field} must be true or false, not {_shown(value)}"
    if kind in ("list_type", "tuple_type"):
        return f"{field} must be a list, not {_shown(value)}"
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        what = "each video" if level == "video" else field
        return f"{what} must be a mapping of fields (name: value), not {_shown(value)}"
    bounds = {
        "greater_than_equal": ("at least", "ge"),
        "greater_than": ("more than", "gt"),
        "less_than_equal": ("at most", "le"),
        "less_than": ("less than", "lt"),
    }
    if kind in bounds:
        words, key = bounds[kind]
        return f"{field} must be {words} {ctx.get(key)}, not {_shown(value)}"
    if kind == "string_too_short":
        least = ctx.get("min_length", 1)
        return f"{field} is empty" if least == 1 else f"{field} needs {least} characters or more"
    if kind == "string_too_long":
        return f"{field} is longer than {ctx.get('max_length')} characters"
    if kind == "too_short":
        return f"{field} needs at least {ctx.get('min_length')} entries"
    if kind == "too_long":
        return f"{field} has more than {ctx.get('max_length')} entries"
    if kind == "string_pattern_mismatch":
        return f"{field} {_shown(value)} is not an id: {_ID_RULE}"
    if kind == "literal_error":
        return f"{field} must be {ctx.get('expected')}, not {_shown(value)}"
    if kind in ("value_error", "assertion_error"):
        reason = str(ctx.get("error", error.get("msg", "")))
        return f"{field}: {reason}" if path and not reason.startswith(path[-1]) else reason
    message = str(error.get("msg", kind))  # a kind not translated above: pydantic's words
    return f"{field}: {message[:1].lower()}{message[1:]}"


def _video_label(raw_items: Any, index: int) -> str:
    item = raw_items[index] if isinstance(raw_items, list) and index < len(raw_items) else None
    video_id = item.get("video_id") if isinstance(item, dict) else None
    if isinstance(video_id, str) and _ID.fullmatch(video_id):
        return f"video {video_id} (item {index + 1})"
    return f"item {index + 1}"


def _duplicates(raw_items: Any) -> list[str]:
    if not isinstance(raw_items, list):
        return []
    ids = [
        (n, item["video_id"])
        for n, item in enumerate(raw_items, start=1)
        if isinstance(item, dict) and isinstance(item.get("video_id"), str)
    ]
    counts = Counter(video_id for _, video_id in ids)
    mistakes = []
    for video_id in (v for v, c in counts.items() if c > 1):
        places = [str(n) for n, v in ids if v == video_id]
        mistakes.append(
            f"video {_shown(video_id)[1:-1]} (items {', '.join(places)}): the video_id "
            "appears more than once (each video needs its own)"
        )
    return mistakes


def playlist_mistakes(errors: Sequence[Mapping[str, Any]], raw: Any) -> list[str]:
    """Every mistake of a playlist `raw` that pydantic answered with `errors`, in plain
    words, one line each, in the playlist's order; duplicate video ids included."""
    raw_items = raw.get("items") if isinstance(raw, dict) else None
    lines: list[str] = []
    seen_unions: set[tuple[Any, ...]] = set()
    for error in errors:
        loc = list(error["loc"])
        if any(isinstance(p, str) and p.startswith("literal[") for p in loc):
            # the `false` branch of `hero: {candidates: N} | false`: the mapping branch's
            # mistake says it better, when there is one
            prefix = tuple(loc[: next(i for i, p in enumerate(loc) if str(p).startswith("lit"))])
            if any(tuple(e["loc"][: len(prefix)]) == prefix and e is not error for e in errors):
                continue
        if error["type"] == "value_error" and "appears twice" in str(error.get("ctx", {})):
            continue  # found below, with the items' positions
        label = ""
        level = "playlist"
        if len(loc) >= 2 and loc[0] == "items" and isinstance(loc[1], int):
            label = _video_label(raw_items, loc[1])
            loc = loc[2:]
            level = "video"
        path = [str(p) for p in loc if not (isinstance(p, str) and _UNION_BRANCH.match(p))]
        key = (label, tuple(path), error["type"])
        if key in seen_unions:
            continue
        seen_unions.add(key)
        words = _words(error, path, level)
        lines.append(f"{label}: {words}" if label else words)
    return lines + _duplicates(raw_items)
