from __future__ import annotations

import pytest

from core.errors import InvalidInput
from core.money import format_minor, parse_amount
from core.playlist import Playlist, expand, item_idempotency_key, parse_selection

BASE = dict(
    template_spec_hash="t",
    provider_profile="fake",
    item_id="e/v1.p1",
    part=1,
    prompt="p",
    seed=1,
    reference_sha256=[],
)


def test_key_is_32_hex_and_changes_with_every_input() -> None:
    key = item_idempotency_key(**BASE)
    assert len(key) == 32 and int(key, 16) >= 0
    for field, value in [
        ("template_spec_hash", "u"),
        ("provider_profile", "other"),
        ("item_id", "e/v2.p1"),
        ("part", 2),
        ("prompt", "q"),
        ("seed", 2),
        ("reference_sha256", ["abc"]),
    ]:
        assert item_idempotency_key(**{**BASE, field: value}) != key, field


def test_key_encoding_is_unambiguous() -> None:
    """Plain concatenation would make ('ab', 'c') and ('a', 'bc') collide."""
    one = item_idempotency_key(**{**BASE, "item_id": "ab", "prompt": "c"})
    two = item_idempotency_key(**{**BASE, "item_id": "a", "prompt": "bc"})
    assert one != two


def test_keys_are_scoped_by_episode() -> None:
    playlist = Playlist.model_validate(
        {
            "template": {"id": "t", "version": 1, "prompt": "{title} {part}"},
            "items": [{"video_id": "v1", "title": "x", "seed": 1, "parts": [1, 2]}],
        }
    )
    first = expand(playlist, [], "2026-W32-0", "weekly")
    second = expand(playlist, [], "2026-W32-1", "weekly")
    assert [i.prompt for i in first] == ["x 1", "x 2"]
    assert {i.idempotency_key for i in first}.isdisjoint({i.idempotency_key for i in second})


def test_keys_are_scoped_by_pipeline_and_weekly_keys_never_change() -> None:
    playlist = Playlist.model_validate(
        {
            "template": {"id": "t", "version": 1, "prompt": "{title}"},
            "items": [{"video_id": "v1", "title": "x", "seed": 1}],
        }
    )
    weekly = expand(playlist, [], "2026-W35-0", "weekly")
    other = expand(playlist, [], "2026-W35-0", "other")
    assert weekly[0].idempotency_key != other[0].idempotency_key
    unscoped = item_idempotency_key(  # the key as it was before pipelines were in keys
        template_spec_hash=playlist.template.spec_hash(),
        provider_profile="fake",
        item_id="2026-W35-0/v1.p1",
        part=1,
        prompt="x",
        seed=1,
        reference_sha256=[],
    )
    assert weekly[0].idempotency_key == unscoped


@pytest.mark.parametrize(
    "raw",
    [
        {
            "template": {"id": "t", "version": 1, "prompt": "{nope}"},
            "items": [{"video_id": "v", "title": "x", "seed": 1}],
        },
        {
            "template": {"id": "t", "version": 0, "prompt": "x"},
            "items": [{"video_id": "v", "title": "x", "seed": 1}],
        },
        {"template": {"id": "t", "version": 1, "prompt": "x"}, "items": []},
        {
            "template": {"id": "t", "version": 1, "prompt": "x"},
            "items": [{"video_id": "../v", "title": "x", "seed": 1}],
        },
        {
            "template": {"id": "t", "version": 1, "prompt": "x"},
            "items": [{"video_id": "v", "title": "x", "seed": 1, "parts": [1, 1]}],
        },
        {
            "template": {"id": "t", "version": 1, "prompt": "x"},
            "extra": 1,
            "items": [{"video_id": "v", "title": "x", "seed": 1}],
        },
        # issue 9: format specs and conversions (a MemoryError), control characters, bools
        {
            "template": {"id": "t", "version": 1, "prompt": "{title!r:>99999999999}"},
            "items": [{"video_id": "v", "title": "x", "seed": 1}],
        },
        {
            "template": {"id": "t", "version": 1, "prompt": "{title:>20}"},
            "items": [{"video_id": "v", "title": "x", "seed": 1}],
        },
        {
            "template": {"id": "t", "version": 1, "prompt": "{}"},
            "items": [{"video_id": "v", "title": "x", "seed": 1}],
        },
        {
            "template": {"id": "t", "version": 1, "prompt": "x"},
            "items": [{"video_id": "v", "title": "a\x00b", "seed": 1}],
        },
        {
            "template": {"id": "t", "version": 1, "prompt": "x\x1b[31m"},
            "items": [{"video_id": "v", "title": "x", "seed": 1}],
        },
        {
            "template": {"id": "t", "version": 1, "prompt": "x"},
            "items": [{"video_id": "v", "title": "x", "seed": True}],
        },
        {
            "template": {"id": "t", "version": True, "prompt": "x"},
            "items": [{"video_id": "v", "title": "x", "seed": 1}],
        },
        {
            "template": {"id": "t", "version": 1, "prompt": "x"},
            "items": [{"video_id": "v", "title": "x", "seed": 1, "parts": [True]}],
        },
        {
            "template": {"id": "t", "version": 1, "prompt": "x"},
            "items": [{"video_id": "v", "title": "x", "seed": 1.5}],
        },
        {
            "template": {"id": "t", "version": 1, "prompt": "x"},
            "items": [{"video_id": "v", "title": "x", "seed": 1, "parts": [2147483648]}],
        },
        {
            "template": {"id": "t", "version": 1, "prompt": "x"},
            "items": [{"video_id": "v", "title": "a\x9bb", "seed": 1}],  # C1 CSI
        },
        {
            "template": {"id": "t", "version": 1, "prompt": "x"},
            "items": [{"video_id": "v", "title": "a\u202eb", "seed": 1}],  # bidi override
        },
        {
            "template": {"id": "t", "version": 1, "prompt": "x"},
            "items": [
                {"video_id": f"v{n}", "title": "x", "seed": 1, "parts": list(range(1, 101))}
                for n in range(1001)
            ],  # 100,100 images in one plan
        },
    ],
)
def test_bad_playlists_are_refused(raw: dict) -> None:
    with pytest.raises(ValueError):
        Playlist.model_validate(raw)


def test_selection() -> None:
    assert parse_selection("3,7-9", 12) == {3, 7, 8, 9}
    for bad in ("0", "13", "9-7", "a", "1,,2", "-1"):
        with pytest.raises(InvalidInput):
            parse_selection(bad, 12)


def test_money_is_integer_minor_units() -> None:
    assert parse_amount("12.50") == 1250 and parse_amount("0") == 0
    assert format_minor(1250) == "12.50 USD"
    assert parse_amount(" 999999999.99 ") == 99_999_999_999 and parse_amount("0.5") == 50
    for bad in (
        "-1",
        "1.001",
        "NaN",
        "inf",
        "abc",
        "",
        "1e999999999",  # issue 9: Decimal takes it and int() of it never ends
        "1E3",
        "\u0661\u0662",  # Arabic-Indic digits: Decimal reads them as 12
        "\uff11",  # a full-width 1
        "+5",
        "1,000",
        "1000000000",
        "5.",
        ".5",
    ):
        with pytest.raises(InvalidInput):
            parse_amount(bad)


def test_a_rendered_prompt_longer_than_its_column_is_refused_when_planning() -> None:
    playlist = Playlist.model_validate(
        {
            "template": {"id": "t", "version": 1, "prompt": "{title}" * 40},
            "items": [{"video_id": "v1", "title": "x" * 300, "seed": 1}],
        }
    )
    with pytest.raises(InvalidInput, match="at most 8000"):
        expand(playlist, [], "2026-W32-0", "weekly")


def test_a_playlist_without_a_reference_image_keeps_the_hash_it_was_recorded_with() -> None:
    """Adding the optional `reference_image` field must not change the hash of playlists
    that do not use it: a changed hash records a new plan, which moves a generated episode
    back to allocated and refuses to plan an approved one (the weekly flow plans on every
    run). The value is what the code before the field computed for the example playlist."""
    from pathlib import Path

    from pipeline.playlists import load_playlist, playlist_sha256

    example = Path(__file__).resolve().parents[2] / "examples" / "playlist.yaml"
    playlist, _references = load_playlist(example)
    assert playlist.reference_image is None
    assert playlist_sha256(playlist) == (
        "eabec14135c2c9dad1b21d497ef260667de5cd450351a0be153d410108ad427a"
    )
