"""The playlist: what an episode generates (format documented in docs/playlist.md).

Pure data and rules; reading the YAML file and hashing reference assets happen in `pipeline`.
"""

from __future__ import annotations

import hashlib
import json
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from episodic.core.documents import WholeInt
from episodic.core.errors import InvalidInput
from episodic.core.ids import shown
from episodic.core.settings import UNSCOPED_PIPELINE

_ID = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
# C0 and C1 controls (NUL, ESC, CSI) and bidirectional overrides; tab and newlines are text
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
MAX_PART = 9999
MAX_IMAGES_PER_PLAN = 100_000
MAX_PROMPT_CHARS = 8000  # items.prompt: checked when planning, on every backend
MAX_CANDIDATES = 50  # paid candidates of one hero image
SEED_MODULUS = 2**31  # seeds are 0 .. 2^31-1
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
    version: WholeInt = Field(ge=1, le=1_000_000, strict=True)
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
            named = ", ".join(f"{{{name}}}" for name in sorted(unknown))
            known = ", ".join(f"{{{name}}}" for name in sorted(PROMPT_FIELDS))
            raise ValueError(f"unknown placeholder {named}; the prompt can use {known}")
        return prompt

    def spec_hash(self) -> str:
        return hashlib.sha256(canonical_json(self.model_dump()).encode()).hexdigest()


class Hero(_Strict):
    """A hero run: the video's one image generated `candidates` times; a reviewer picks one."""

    candidates: WholeInt = Field(ge=1, le=MAX_CANDIDATES, strict=True)


class Video(_Strict):
    video_id: str = Field(pattern=f"^{_ID}$")
    title: str = Field(min_length=1, max_length=300)
    parts: list[WholeInt] = Field(
        default_factory=lambda: [1],
        min_length=1,
        max_length=100,
        json_schema_extra={
            "items": {"type": "integer", "minimum": 1, "maximum": MAX_PART},
            "uniqueItems": True,
        },
    )
    seed: WholeInt = Field(ge=0, le=SEED_MODULUS - 1, strict=True)  # `seed: true` is not 1
    # a hero run for this video; `false`: never, whatever the playlist's `hero` says;
    # None: the playlist's `hero` decides
    hero: Hero | Literal[False] | None = None

    @field_validator("hero", mode="before")
    @classmethod
    def _hero_is_a_mapping_or_false(cls, value: Any) -> Any:
        if value is None or value is False or isinstance(value, dict | Hero):
            return value
        raise ValueError("hero is {candidates: N} or false")  # not 0, "false", 1, ...

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

    @model_validator(mode="after")
    def _hero_has_one_image(self) -> Video:
        if isinstance(self.hero, Hero) and self.parts != [1]:
            raise ValueError("a hero video has one image, generated as candidates: remove parts")
        return self


REFERENCE_IMAGE_TYPES = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".webp": "image/webp",
}
MAX_REFERENCE_IMAGE_BYTES = 10 * 1024 * 1024


class Playlist(_Strict):
    # `items` is the key people write (and the key of every recorded plan and its hash); in
    # Python the field is `videos`, since an item is one paid image
    model_config = ConfigDict(extra="forbid", frozen=True, serialize_by_alias=True)

    template: Template
    provider_profile: str = Field(default="fake", pattern=f"^{_ID}$")
    reference_assets: list[str] = Field(default_factory=list, max_length=20)
    # one of the reference assets, sent with every item as the model's reference image
    reference_image: str | None = Field(default=None, min_length=1, max_length=1024)
    # a hero run for every video without a `hero` of its own (each must have one image)
    hero: Hero | None = None
    videos: list[Video] = Field(alias="items", min_length=1, max_length=100_000)

    def hero_of(self, video: Video) -> Hero | None:
        """The hero run of `video`: its own, else the playlist's (unless it says false)."""
        if video.hero is False:
            return None
        return video.hero if video.hero is not None else self.hero

    def images_of(self, video: Video) -> int:
        hero = self.hero_of(video)
        return hero.candidates if hero is not None else len(video.parts)

    def with_hero_candidates(self, candidates: int) -> Playlist:
        """This playlist with every hero run at `candidates` (`--hero-candidates`): the
        playlist's own and each video's. A playlist without any hero run gets a
        playlist-wide one for its one-image videos (a video with several parts keeps them).
        Raises `InvalidInput` when no video can be a hero video."""
        if not 1 <= candidates <= MAX_CANDIDATES:
            raise InvalidInput(f"--hero-candidates must be 1 to {MAX_CANDIDATES}")
        hero = Hero(candidates=candidates).model_dump()
        declared = self.hero is not None or any(isinstance(v.hero, Hero) for v in self.videos)
        videos = []
        for video in self.videos:
            dump = video.model_dump()
            if isinstance(video.hero, Hero):
                dump["hero"] = hero
            elif not declared and video.hero is None and video.parts != [1]:
                dump["hero"] = False  # keeps its parts under the new playlist-wide run
            videos.append(dump)
        top = hero if (self.hero is not None or not declared) else None
        changed = Playlist.model_validate({**self.model_dump(), "hero": top, "items": videos})
        if not any(changed.hero_of(video) for video in changed.videos):
            raise InvalidInput(
                "--hero-candidates: no video of the plan can be a hero video (each has "
                "several parts or says hero: false)"
            )
        return changed

    @model_validator(mode="after")
    def _heroes_have_one_image(self) -> Playlist:
        if self.hero is not None:
            for video in self.videos:
                if video.hero is None and video.parts != [1]:
                    raise ValueError(
                        f"video {video.video_id} has parts {video.parts}: the playlist's hero "
                        "run covers one-image videos; give it hero: false"
                    )
        return self

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
        images = sum(self.images_of(video) for video in self.videos)
        if images > MAX_IMAGES_PER_PLAN:
            raise ValueError(f"{images} images in one plan; at most {MAX_IMAGES_PER_PLAN}")
        seen: set[str] = set()
        for video in self.videos:
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
    """One paid image: one part of one video, or one candidate of a video's hero image,
    with everything its key is made of."""

    index: int  # 1-based position of the video in the playlist (what --only selects)
    video_id: str
    part: int  # 0 for a hero candidate (it has no part)
    prompt: str
    seed: int
    idempotency_key: str
    candidate: int | None = None  # 1..N for a hero candidate

    @property
    def item_id(self) -> str:
        return item_label(self.video_id, self.part, self.candidate)


def item_label(video_id: str, part: int, candidate: int | None) -> str:
    """How people see an item: `v01.p2` (part 2 of v01) or `v01.c3` (hero candidate 3)."""
    return f"{video_id}.c{candidate}" if candidate is not None else f"{video_id}.p{part}"


CANDIDATE_SEED_STRIDE = 104_729  # a prime far from the small steps people number seeds by


def candidate_seed(seed: int, candidate: int) -> int:
    """The seed of hero candidate `candidate` (1-based) of a video whose seed is `seed`:
    ``(seed + (candidate - 1) * 104729) mod 2^31``. The ordinal is folded in, so each
    candidate is a different image of a seeded model; candidate 1 keeps the video's seed;
    the stride keeps candidates off the neighbouring seeds other videos usually have
    (1001, 1002, ...: the same prompt and seed would be the same paid input twice). Stable:
    it depends on nothing else."""
    return (seed + (candidate - 1) * CANDIDATE_SEED_STRIDE) % SEED_MODULUS


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def item_idempotency_key(
    *,
    template_spec_hash: str,
    provider_profile: str,
    item_id: str,
    part: int | None,
    prompt: str,
    seed: int,
    reference_sha256: list[str],
    candidate: int | None = None,
) -> str:
    """sha256 over canonical JSON of every input that changes the paid output (32 hex).

    A hero candidate (`candidate` 1..N, `part` None, `seed` already folded by
    `candidate_seed`) also carries its ordinal, so candidates differ even for a provider
    that takes no seed; a part's payload is unchanged (its keys predate hero runs)."""
    fields: dict[str, Any] = {
        "template": template_spec_hash,
        "profile": provider_profile,
        "item": item_id,
        "part": part,
        "prompt": prompt,
        "seed": seed,
        "references": sorted(reference_sha256),
    }
    if candidate is not None:
        fields["candidate"] = candidate
    return hashlib.sha256(canonical_json(fields).encode()).hexdigest()[:32]


def scoped_item_id(pipeline: str, episode_id: str, video_id: str, part: int | None) -> str:
    """The item id inside a key: scoped by episode and pipeline, so two episodes (of one
    pipeline or of two) planned from one playlist never share a key, a row or a file. The
    pipeline `weekly` keeps the form that predates pipeline scoping (its keys never change);
    pipeline names cannot contain ':', so the two forms never meet. A hero image (`part`
    None) is `{episode_id}/{video_id}.hero`; its candidates differ by seed and ordinal."""
    image = f"{video_id}.hero" if part is None else f"{video_id}.p{part}"
    item = f"{episode_id}/{image}"
    return item if pipeline == UNSCOPED_PIPELINE else f"{pipeline}:{item}"


def expand(
    playlist: Playlist, reference_sha256: list[str], episode_id: str, pipeline: str
) -> list[PlannedItem]:
    """Every paid image of the playlist for one episode of one pipeline, with its key."""
    spec = playlist.template.spec_hash()
    planned = []
    for index, video in enumerate(playlist.videos, start=1):
        hero = playlist.hero_of(video)
        # a hero image has no part: `{part}` renders empty, and every candidate has one prompt
        slots: list[tuple[int | None, int | None]] = (
            [(None, n) for n in range(1, hero.candidates + 1)]
            if hero is not None
            else [(part, None) for part in video.parts]
        )
        for part, candidate in slots:
            prompt = playlist.template.prompt.format(
                title=video.title,
                part="" if part is None else part,
                video_id=video.video_id,
                index=index,
            )
            if len(prompt) > MAX_PROMPT_CHARS:
                where = f"part {part}" if part is not None else "hero image"
                raise InvalidInput(
                    f"video {video.video_id} {where}: the prompt is {len(prompt)} "
                    f"characters; at most {MAX_PROMPT_CHARS}"
                )
            seed = video.seed if candidate is None else candidate_seed(video.seed, candidate)
            key = item_idempotency_key(
                template_spec_hash=spec,
                provider_profile=playlist.provider_profile,
                item_id=scoped_item_id(pipeline, episode_id, video.video_id, part),
                part=part,
                prompt=prompt,
                seed=seed,
                reference_sha256=reference_sha256,
                candidate=candidate,
            )
            planned.append(
                PlannedItem(index, video.video_id, part or 0, prompt, seed, key, candidate)
            )
    return planned


def hero_candidates(items: list[PlannedItem]) -> dict[str, list[PlannedItem]]:
    """The plan's hero videos, in plan order: video id -> its candidates (1..N, in order)."""
    heroes: dict[str, list[PlannedItem]] = {}
    for item in items:
        if item.candidate is not None:
            heroes.setdefault(item.video_id, []).append(item)
    return heroes


_PICK = re.compile(r"(" + _ID + r")=([1-9][0-9]{0,5})")


def parse_picks(text: str) -> dict[str, int]:
    """'v01=2,v02=1' -> {'v01': 2, 'v02': 1}: which candidate ships, per hero video.
    Checks the syntax only (`check_picks` checks them against a plan); raises InvalidInput."""
    if not text.isprintable():  # a newline or escape is refused, not stripped
        raise InvalidInput(f"invalid --pick {shown(text)}: control characters")
    picks: dict[str, int] = {}
    for chunk in text.split(","):
        match = _PICK.fullmatch(chunk.strip())
        if match is None:
            raise InvalidInput(f"invalid --pick {shown(text)}: expected e.g. v01=2,v02=1")
        if match[1] in picks:
            raise InvalidInput(f"invalid --pick: video {match[1]} is picked twice")
        picks[match[1]] = int(match[2])
    return picks


def check_picks(
    picks: dict[str, int], heroes: Mapping[str, Sequence[object]], what: str = "--pick"
) -> dict[str, int]:
    """Every hero video has exactly one pick within its candidates, and nothing else is
    picked. Returns the picks in plan order; raises InvalidInput naming the first fault."""
    for video_id, pick in picks.items():
        if video_id not in heroes:
            raise InvalidInput(f"{what}: video {shown(video_id)} has no hero candidates")
        count = len(heroes[video_id])
        if not 1 <= pick <= count:
            raise InvalidInput(
                f"{what}: video {video_id} has candidates 1-{count}; {pick} is not one of them"
            )
    missing = [video_id for video_id in heroes if video_id not in picks]
    if missing:
        raise InvalidInput(
            f"{what}: no pick for {', '.join(missing)}: a hero video is approved with the "
            f"candidate that ships, e.g. {what} {missing[0]}=1"
        )
    return {video_id: picks[video_id] for video_id in heroes}
