"""A profile's price as its providers file states it (``price:``), and what the profile's
inputs tell of an image's size before it is bought (`known_size`). See `episodic.providers.profiles`
for the file and `episodic.core.pricing` for how a price charges."""

from __future__ import annotations

import math
from typing import Literal, TypeGuard

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from episodic.core.money import MAX_IMAGE_COST_MICROS, MICROS, parse_money
from episodic.core.pricing import Basis

MAX_AT_MOST = 10**6  # megapixels or seconds an image may be bounded by
# fal's ``image_size`` presets and the size each asks for
# (https://docs.fal.ai/documentation/model-apis/model-arguments)
FAL_IMAGE_SIZES = {
    "square_hd": (1024, 1024),
    "square": (512, 512),
    "portrait_4_3": (768, 1024),
    "portrait_16_9": (576, 1024),
    "landscape_4_3": (1024, 768),
    "landscape_16_9": (1024, 576),
}


class PriceSpec(BaseModel):
    """A profile's ``price``: one basis with its unit price (a decimal string), and the
    upper bound of its quantity (``at_most``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    per_image: str | None = None
    per_megapixel: str | None = None
    per_second: str | None = None
    whole_megapixels: bool = Field(default=False, strict=True)
    at_most: str | None = None
    # whether the provider bills a job that ends failed or cancelled (None: the kind's rule,
    # `Profile.bills_failures`)
    failed: Literal["billed", "free"] | None = None

    @field_validator("per_image", "per_megapixel", "per_second", "at_most", mode="before")
    @classmethod
    def _quoted(cls, value: object) -> object:
        """A YAML number (``0.003`` unquoted) is a float before we see it: refused, never
        read through binary floating point."""
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(
                f'{value!r} is not a price; write a plain decimal string such as "0.003"'
            )
        if isinstance(value, int | float) and not isinstance(value, bool):
            raise ValueError(
                f'{value!r} is a number; write it as a quoted decimal string, e.g. "{value}"'
            )
        return value

    @model_validator(mode="after")
    def _one_basis(self) -> PriceSpec:
        given = [b for b in ("per_image", "per_megapixel", "per_second") if getattr(self, b)]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of per_image, per_megapixel, per_second (a decimal string "
                'such as "0.003")'
            )
        for name in given + (["at_most"] if self.at_most is not None else []):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise ValueError(f"{name}: write the amount as a quoted decimal string")
            micros = parse_money(value, name)  # InvalidInput is a ValueError
            if micros > MAX_IMAGE_COST_MICROS:
                raise ValueError(f"{name}: {value} is above what one image may cost")
        if self.whole_megapixels and self.per_megapixel is None:
            raise ValueError("whole_megapixels: only a per_megapixel price has it")
        if self.per_image is not None and self.at_most is not None:
            raise ValueError("at_most: a per_image price is the most an image costs already")
        if self.per_megapixel is not None and self.at_most is None:
            raise ValueError(
                "at_most: a per_megapixel price needs the most megapixels an image has "
                '(e.g. "1.05"), which estimates and budgets reserve before the image exists'
            )
        if self.at_most is not None and not 0 < parse_money(self.at_most) <= MAX_AT_MOST * MICROS:
            raise ValueError(f"at_most: more than 0 and at most {MAX_AT_MOST}")
        return self

    @property
    def basis(self) -> Basis:
        if self.per_image is not None:
            return "per_image"
        if self.per_megapixel is not None:
            return "per_whole_megapixel" if self.whole_megapixels else "per_megapixel"
        return "per_second"

    @property
    def unit_micros(self) -> int:
        return parse_money(self.per_image or self.per_megapixel or self.per_second or "")


def known_size(kind: str, inputs: dict[str, object]) -> tuple[int, int, str] | None:
    """The image size a profile's constant `inputs` ask for, known before buying: (width,
    height, where it comes from), from ``width`` and ``height`` inputs, a fal ``image_size``
    preset (`FAL_IMAGE_SIZES`) or fal's ``image_size: {width, height}`` object (read when the
    file loads: `episodic.providers.model_inputs`); None when the inputs do not say."""
    sides = [inputs.get("width"), inputs.get("height")]
    wh = [v for v in sides if _pixels(v)]
    if len(wh) == 2:
        return wh[0], wh[1], f"inputs width {wh[0]}, height {wh[1]}"
    size = inputs.get("image_size")
    if kind == "fal" and isinstance(size, str) and size in FAL_IMAGE_SIZES:
        w, h = FAL_IMAGE_SIZES[size]
        return w, h, f"image_size {size} ({w}x{h})"
    if kind == "fal" and isinstance(size, dict):
        width, height = size.get("width"), size.get("height")
        if _pixels(width) and _pixels(height):
            return width, height, f"image_size {width}x{height}"
    return None


def _pixels(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
