"""The playlist: what an episode generates (format documented in docs/playlist.md).

Pure data and rules; reading the YAML file and hashing reference assets happen in `pipeline`.
"""

from __future__ import annotations

import hashlib
import json
import re
import string
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

from core.errors import InvalidInput
from core.ids import shown
from core.settings import UNSCOPED_PIPELINE

_ID = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
# C0 and C1 controls (NUL, ESC, CSI) and bidirectional overrides; tab and newlines are text
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
MAX_PART = 9999
MAX_IMAGES_PER_PLAN = 100_000
MAX_PROMPT_CHARS = 8000  # items.prompt: checked when planning, on every backend
PROMPT_FIELDS = frozenset({"title", "part", "video_id", "index"})


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _no_control(text: str) -> str:
    if _CONTROL.search(text):
        raise ValueError("control characters (NUL, escapes, bidi overrides) are not allowed")
    return text


def no_control_characters(text: str) -> str:
    """A pydantic validator: `text` unchanged, or ValueError if it holds control characters."""
    return _no_control(text)


def check_text(text: str, what: str) -> str:
    """Free text from people (titles, notes, reasons): no control characters. Raises
    `InvalidInput` naming `what`."""
    try:
        return _no_control(text)
    except ValueError as exc:
        raise InvalidInput(f"{what}: {exc}") from None


class Template(_Strict):
    id: str = Field(pattern=f"^{_ID}$")
    version: int = Field(ge=1, le=1_000_000, strict=True)
    prompt: str = Field(min_length=1, max_length=4000)

    @field_validator("prompt")
    @classmethod
    def _known_fields(cls, prompt: str) -> str:
        _no_control(prompt)
        try:
            parsed = list(string.Formatter().parse(prompt))
        except ValueError as exc:
            raise ValueError(f"bad placeholder syntax: {exc}") from None
        for _, name, spec, conversion in parsed:
            if name is not None and (spec or conversion):  # {title!r:>99999999999}
                raise ValueError(
                    f"placeholder {{{name}}} has a conversion or format spec: "
                    "use bare placeholders such as {title}"
                )
        fields = {name for _, name, _, _ in parsed if name is not None}
        if "" in fields:
            raise ValueError("empty placeholder {}: name the field, e.g. {title}")
        unknown = fields - PROMPT_FIELDS
        if unknown:
            raise ValueError(f"unknown placeholders {sorted(unknown)}; use {sorted(PROMPT_FIELDS)}")
        return prompt

    def spec_hash(self) -> str:
        return hashlib.sha256(canonical_json(self.model_dump()).encode()).hexdigest()


class Video(_Strict):
    video_id: str = Field(pattern=f"^{_ID}$")
    title: str = Field(min_length=1, max_length=300)
    parts: list[StrictInt] = Field(default_factory=lambda: [1], min_length=1, max_length=100)
    seed: int = Field(ge=0, le=2**31 - 1, strict=True)  # `seed: true` is not 1

    @field_validator("title")
    @classmethod
    def _printable_title(cls, title: str) -> str:
        return _no_control(title)

    @field_validator("parts")
    @classmethod
    def _distinct_positive(cls, parts: list[int]) -> list[int]:
        if any(p < 1 or p > MAX_PART for p in parts) or len(set(parts)) != len(parts):
            raise ValueError(f"parts must be distinct numbers from 1 to {MAX_PART}")
        return parts


REFERENCE_IMAGE_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg",
                         ".webp": "image/webp"}  # fmt: skip
MAX_REFERENCE_IMAGE_BYTES = 10 * 1024 * 1024


class Playlist(_Strict):
    template: Template
    provider_profile: str = Field(default="fake", pattern=f"^{_ID}$")
    reference_assets: list[str] = Field(default_factory=list, max_length=20)
    # one of the reference assets, sent with every item as the model's reference image
    reference_image: str | None = Field(default=None, min_length=1, max_length=1024)
    items: list[Video] = Field(min_length=1, max_length=100_000)

    @model_validator(mode="after")
    def _reference_image_is_an_asset(self) -> Playlist:
        name = self.reference_image
        if name is None:
            return self
        if name not in self.reference_assets:
            raise ValueError(
                "reference_image must be one of reference_assets (its hash is in every key)"
            )
        if reference_image_type(name) is None:
            raise ValueError(
                f"reference_image must be a {', '.join(sorted(REFERENCE_IMAGE_TYPES))} file"
            )
        return self

    def reference_image_sha256(self, reference_sha256: list[str]) -> str | None:
        """The reference image's hash, from the assets' hashes (in `reference_assets` order)."""
        if self.reference_image is None:
            return None
        return reference_sha256[self.reference_assets.index(self.reference_image)]

    @model_validator(mode="after")
    def _unique_videos(self) -> Playlist:
        images = sum(len(video.parts) for video in self.items)
        if images > MAX_IMAGES_PER_PLAN:
            raise ValueError(f"{images} images in one plan; at most {MAX_IMAGES_PER_PLAN}")
        seen: set[str] = set()
        for video in self.items:
            if video.video_id in seen:
                raise ValueError(f"video_id {video.video_id!r} appears twice")
            seen.add(video.video_id)
        return self


def reference_image_type(name: str) -> str | None:
    """The media type of a reference image file name, by its suffix (None: not an image)."""
    dot = name.rfind(".")
    return REFERENCE_IMAGE_TYPES.get(name[dot:].lower()) if dot >= 0 else None


@dataclass(frozen=True, slots=True)
class PlannedItem:
    """One paid image: one part of one video, with everything its key is made of."""

    index: int  # 1-based position of the video in the playlist (what --only selects)
    video_id: str
    part: int
    prompt: str
    seed: int
    idempotency_key: str

    @property
    def item_id(self) -> str:
        return f"{self.video_id}.p{self.part}"


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def item_idempotency_key(
    *,
    template_spec_hash: str,
    provider_profile: str,
    item_id: str,
    part: int,
    prompt: str,
    seed: int,
    reference_sha256: list[str],
) -> str:
    """sha256 over canonical JSON of every input that changes the paid output (32 hex)."""
    payload = canonical_json(
        {
            "template": template_spec_hash,
            "profile": provider_profile,
            "item": item_id,
            "part": part,
            "prompt": prompt,
            "seed": seed,
            "references": sorted(reference_sha256),
        }
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


def scoped_item_id(pipeline: str, episode_id: str, video_id: str, part: int) -> str:
    """The item id inside a key: scoped by episode and pipeline, so two episodes (of one
    pipeline or of two) planned from one playlist never share a key, a row or a file. The
    pipeline `weekly` keeps the form that predates pipeline scoping (its keys never change);
    pipeline names cannot contain ':', so the two forms never meet."""
    item = f"{episode_id}/{video_id}.p{part}"
    return item if pipeline == UNSCOPED_PIPELINE else f"{pipeline}:{item}"


def expand(
    playlist: Playlist, reference_sha256: list[str], episode_id: str, pipeline: str
) -> list[PlannedItem]:
    """Every paid image of the playlist for one episode of one pipeline, with its key."""
    spec = playlist.template.spec_hash()
    planned = []
    for index, video in enumerate(playlist.items, start=1):
        for part in video.parts:
            prompt = playlist.template.prompt.format(
                title=video.title, part=part, video_id=video.video_id, index=index
            )
            if len(prompt) > MAX_PROMPT_CHARS:
                raise InvalidInput(
                    f"video {video.video_id} part {part}: the prompt is {len(prompt)} "
                    f"characters; at most {MAX_PROMPT_CHARS}"
                )
            item_id = scoped_item_id(pipeline, episode_id, video.video_id, part)
            key = item_idempotency_key(
                template_spec_hash=spec,
                provider_profile=playlist.provider_profile,
                item_id=item_id,
                part=part,
                prompt=prompt,
                seed=video.seed,
                reference_sha256=reference_sha256,
            )
            planned.append(PlannedItem(index, video.video_id, part, prompt, video.seed, key))
    return planned


_RANGE = re.compile(r"([1-9][0-9]*)(?:-([1-9][0-9]*))?")


def parse_selection(text: str, count: int) -> frozenset[int]:
    """'3,7-9' -> {3, 7, 8, 9}; numbers are 1-based video positions, checked against count."""
    chosen: set[int] = set()
    for chunk in text.split(","):
        match = _RANGE.fullmatch(chunk.strip())
        if match is None:
            raise InvalidInput(f"invalid --only {shown(text)}: expected e.g. 3,7-9")
        low = int(match[1])
        high = int(match[2] or low)
        if high < low or high > count:
            raise InvalidInput(f"invalid --only {shown(text)}: the playlist has videos 1-{count}")
        chosen.update(range(low, high + 1))
    return frozenset(chosen)
