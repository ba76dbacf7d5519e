"""fal's ``image_size`` as a ``{width, height}`` mapping in a profile's inputs: read strictly
when the file loads (whole pixels from 1 to 14142 each, fal's published ``ImageSize`` schema,
and no other key), refused in one line naming the profile and the field, sent as the object
and priced before buying as a preset is."""

from __future__ import annotations

from pathlib import Path

import pytest

from episodic.core.errors import ProviderConfigError
from episodic.providers.base import ImageRequest
from episodic.providers.profiles import Profile, load_profiles
from episodic.providers.replicate import model_input

FAL = "    kind: fal\n    model: fal-ai/flux/dev\n    credential_env: KEY\n"
REPLICATE = "    kind: replicate\n    model: owner/name\n    credential_env: KEY\n"
WHOLE = '    price: {per_megapixel: "0.025", whole_megapixels: true, at_most: "1"}\n'


def profile(tmp_path: Path, fields: str) -> Profile:
    path = tmp_path / "providers.yaml"
    path.write_text(f"profiles:\n  p:\n{fields}")
    return load_profiles(path)["p"]


def test_a_width_and_height_mapping_is_sent_as_fals_object_and_priced_before_buying(
    tmp_path: Path,
) -> None:
    found = profile(
        tmp_path, f"{FAL}{WHOLE}    inputs: {{image_size: {{width: 2000, height: 1000}}}}\n"
    )
    assert found.inputs["image_size"] == {"width": 2000, "height": 1000}
    assert found.known_size == (2000, 1000, "image_size 2000x1000")
    assert found.pricing.estimate_micros == 50_000  # two started megapixels at 0.025
    assert "image_size 2000x1000" in found.estimate_text(1)
    request = ImageRequest("ref", "2026-W32-0", "i1", "a fox", 7)
    sent = model_input(found, request)
    assert sent["image_size"] == {"width": 2000, "height": 1000}
    assert set(sent) == {"image_size", "prompt", "seed"}


def test_a_small_size_keeps_the_price_bound_and_an_integral_float_is_its_int(
    tmp_path: Path,
) -> None:
    found = profile(
        tmp_path, f"{FAL}{WHOLE}    inputs: {{image_size: {{width: 512.0, height: 64}}}}\n"
    )
    size = found.inputs["image_size"]
    assert size == {"width": 512, "height": 64}
    assert isinstance(size, dict) and all(type(v) is int for v in size.values())
    assert found.pricing.estimate_micros == 25_000  # under at_most, which stays


@pytest.mark.parametrize(
    ("size", "said"),
    [
        ("{width: 0, height: 512}", "width"),
        ("{width: -5, height: 512}", "width"),
        ("{width: 512, height: 14143}", "height"),
        ("{width: 512.5, height: 512}", "width"),
        ('{width: "512", height: 512}', "width"),
        ("{width: true, height: 512}", "width"),
        ("{width: null, height: 512}", "width"),
        ("{width: [512], height: 512}", "width"),
        ("{width: 512}", "height"),
        ("{height: 512}", "width"),
        ("{}", "width"),
        ("{width: 512, height: 512, depth: 3}", "depth"),
        ("{width: 512, height: 512, 1: 2}", "1"),
        ("{width: {w: 1}, height: 512}", "width"),
    ],
)
def test_a_bad_size_mapping_is_one_line_naming_the_profile_and_the_field(
    tmp_path: Path, size: str, said: str
) -> None:
    with pytest.raises(ProviderConfigError) as raised:
        profile(tmp_path, f"{FAL}{WHOLE}    inputs: {{image_size: {size}}}\n")
    message = str(raised.value)
    assert "profile 'p'" in message and "field inputs" in message, message
    said_of = message.split("field inputs", 1)[1]
    assert "image_size" in said_of and said in said_of and "14142" in said_of, message
    assert "\n" not in message and "Value error" not in message, message


@pytest.mark.parametrize(
    ("fields", "said"),
    [  # a mapping is fal's image_size only: any other would be sent and never priced
        (f"{FAL}{WHOLE}    inputs: {{size: {{width: 512, height: 512}}}}\n", "size"),
        (
            f'{REPLICATE}    price: {{per_megapixel: "0.02", at_most: "1"}}\n'
            "    inputs: {image_size: {width: 512, height: 512}}\n",
            "image_size",
        ),
    ],
)
def test_a_size_mapping_anywhere_but_fals_image_size_is_refused(
    tmp_path: Path, fields: str, said: str
) -> None:
    with pytest.raises(ProviderConfigError) as raised:
        profile(tmp_path, fields)
    message = str(raised.value)
    said_of = message.split("profile 'p'", 1)[1]
    assert "inputs" in said_of and said in said_of and "fal" in said_of, message
    assert "\n" not in message and "Value error" not in message, message


@pytest.mark.parametrize("preset", ["SQUARE_HD", "square-hd", "squarehd", "portrait_3_4"])
def test_a_fal_preset_fal_does_not_spell_so_is_refused_when_the_file_loads(
    tmp_path: Path, preset: str
) -> None:
    """fal refuses an unknown ``image_size`` preset (422) only once the request is sent, and
    its price bound could not see the size it asks for: the file is refused first, naming
    the presets as fal spells them."""
    with pytest.raises(ProviderConfigError) as refused:
        profile(tmp_path, f"{FAL}{WHOLE}    inputs: {{image_size: {preset}}}\n")
    said = str(refused.value)
    assert "image_size" in said and preset in said and "square_hd" in said, said
    assert "\n" not in said


def test_a_fal_preset_spelled_as_fal_does_is_priced_before_buying(tmp_path: Path) -> None:
    found = profile(tmp_path, f"{FAL}{WHOLE}    inputs: {{image_size: portrait_4_3}}\n")
    assert found.known_size == (768, 1024, "image_size portrait_4_3 (768x1024)")


@pytest.mark.parametrize("count", ["0", "2", "-1", "true"])
def test_an_image_count_other_than_one_is_refused_in_words_that_fit_it(
    tmp_path: Path, count: str
) -> None:
    with pytest.raises(ProviderConfigError) as refused:
        profile(
            tmp_path,
            f'{REPLICATE}    price: {{per_image: "0.003"}}\n    inputs: {{num_outputs: {count}}}\n',
        )
    said = str(refused.value)
    assert "exactly one image a call" in said and "more than one" not in said, said
