"""A profile's constant model inputs (``inputs:`` in the providers file, `providers.profiles`),
read strictly when the file loads: names as models name their inputs; values finite numbers,
booleans, text of up to 1000 characters, or, for fal's ``image_size`` only, the
``{width, height}`` object fal documents for a custom size; never more than one image a call.
Every size an input asks for is one `episodic.providers.prices.known_size` prices before buying.

Errors are `ValueError` with one line naming the input, which the profile loader prefixes
with the file, the profile and the field."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

from episodic.providers.prices import FAL_IMAGE_SIZES

INPUT_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"  # a model input's name
SizeInput = dict[str, int]  # {"width": W, "height": H}, whole pixels
InputValue = str | int | float | bool | SizeInput  # a constant model input
SIZE_INPUT = "image_size"  # the one input that takes a size object (fal's)
# fal's published ``ImageSize`` schema (each endpoint's OpenAPI document, e.g.
# https://fal.ai/api/openapi/queue/openapi.json?endpoint_id=fal-ai/flux/dev): width and height
# are integers, exclusiveMinimum 0, maximum 14142, and nothing else
MAX_SIDE = 14142
OUTPUT_COUNT_INPUTS = frozenset({"num_outputs", "num_images"})
"""Inputs that ask a model for several images a call (Replicate's ``num_outputs``, fal's
``num_images``). The provider bills every image it makes (Replicate's official models by
output, https://replicate.com/changelog/2025-01-29-official-models; fal each image), but an
item is one image: a call is priced, capped and stored as one, so a profile that asks for
more is refused when it loads rather than billed for images nobody priced or keeps."""


def size_objects(value: object) -> object:
    """`value` (the file's ``inputs`` mapping) with each mapping value read as a size: only
    ``image_size`` takes one, exactly ``{width, height}``, each a whole number of pixels from
    1 to `MAX_SIDE` (an integral float such as ``1024.0`` is its int, as JSON Schema's
    "integer" reads it; a bool, text or fraction is refused). Anything else is left to the
    type check. Raises `ValueError`."""
    if not isinstance(value, dict):
        return value
    read = dict(value)
    for name, item in value.items():
        if isinstance(item, dict):
            if name != SIZE_INPUT:
                raise ValueError(
                    f"input {_shown(name)}: a {{width, height}} mapping is fal's {SIZE_INPUT} "
                    "only; other inputs are numbers, booleans or text"
                )
            read[name] = _size(item)
    return read


def check_values(value: dict[str, InputValue]) -> dict[str, InputValue]:
    """Names as model inputs are named; values finite numbers, booleans or short text (a
    size object was read by `size_objects`). Raises `ValueError`."""
    for name, item in value.items():
        if not re.fullmatch(INPUT_NAME, name):
            raise ValueError(f"input name {_shown(name)} is not an input name")
        if isinstance(item, float) and not math.isfinite(item):
            raise ValueError(f"input {name}: numbers must be finite")
        if isinstance(item, int) and abs(item) > 2**53:  # what JSON carries exactly
            raise ValueError(f"input {name}: integers are at most 2^53 in size")
        if isinstance(item, str) and len(item) > 1000:
            raise ValueError(f"input {name}: text longer than 1000 characters")
    return value


def check_for_kind(kind: str, inputs: dict[str, InputValue], per_item: Iterable[str]) -> None:
    """What a replicate or fal profile's inputs may not say: an input set per item (`per_item`:
    the prompt, seed and reference image inputs), other than one image a call, a size
    object outside fal, a fal ``image_size`` that is not one of its presets
    (`episodic.providers.prices.FAL_IMAGE_SIZES`). Raises `ValueError`."""
    taken = set(per_item) & set(inputs)
    if taken:
        raise ValueError(f"inputs: {', '.join(sorted(map(str, taken)))} is set per item")
    for name in sorted(OUTPUT_COUNT_INPUTS & set(inputs)):
        count = inputs[name]
        if isinstance(count, bool) or count != 1:
            raise ValueError(
                f"inputs: {name}: {_shown(count)}; episodic buys exactly one image a call "
                f"(the provider bills each image it makes, and episodic keeps one): set "
                f"{name}: 1 or remove it"
            )
    preset = inputs.get(SIZE_INPUT)
    if kind == "fal" and isinstance(preset, str) and preset not in FAL_IMAGE_SIZES:
        raise ValueError(  # fal refuses it (422) only after the request was sent
            f"inputs: {SIZE_INPUT}: {_shown(preset)} is not one of fal's presets "
            f"({', '.join(FAL_IMAGE_SIZES)}, spelled so) nor a {{width, height}} object"
        )
    if kind != "fal" and isinstance(inputs.get(SIZE_INPUT), dict):
        raise ValueError(
            f"inputs: {SIZE_INPUT}: a {{width, height}} object is fal's form; a {kind} model "
            "takes width and height inputs"
        )


def _size(item: dict[object, object]) -> SizeInput:
    extra = [key for key in item if key not in ("width", "height")]
    if extra:
        raise ValueError(
            f"input {SIZE_INPUT}: {{width, height}} (whole pixels, 1 to {MAX_SIDE}) and "
            f"nothing else, not {_shown(extra[0])}"
        )
    size = {}
    for side in ("width", "height"):
        pixels = item.get(side)
        if isinstance(pixels, float) and pixels.is_integer():
            pixels = int(pixels)
        if not isinstance(pixels, int) or isinstance(pixels, bool) or not 1 <= pixels <= MAX_SIDE:
            said = "missing" if side not in item else _shown(pixels)
            raise ValueError(
                f"input {SIZE_INPUT}: {side} is a whole number of pixels from 1 to {MAX_SIDE} "
                f"(fal's limit), not {said}"
            )
        size[side] = pixels
    return size


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 64 else f"{text[:60]}…"
