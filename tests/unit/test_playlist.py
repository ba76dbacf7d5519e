from __future__ import annotations

import pytest

from episodic.core.errors import InvalidInput
from episodic.core.money import format_money, parse_money
from episodic.core.playlist import Playlist, expand, item_idempotency_key
from episodic.core.selection import parse_selection

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
        # format specs and conversions (a MemoryError), control characters, bools
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
    assert parse_money("12.50") == 12_500_000 and parse_money("0") == 0
    assert format_money(12_500_000) == "12.50 USD" and format_money(3_000) == "0.003 USD"
    assert parse_money(" 999999999.99 ") == 999_999_999_990_000
    assert parse_money("0.5") == 500_000 and parse_money("0.000725") == 725
    assert format_money(725, "EUR") == "0.000725 EUR" and format_money(0) == "0.00 USD"
    for bad in (
        "-1",
        "1.0000001",  # a seventh decimal
        "NaN",
        "inf",
        "abc",
        "",
        "1e999999999",  # Decimal takes it and int() of it never ends
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
            parse_money(bad)


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

    from episodic.pipeline.playlists import load_playlist, playlist_sha256

    example = Path(__file__).resolve().parents[2] / "examples" / "playlist.yaml"
    playlist, _references = load_playlist(example)
    assert playlist.reference_image is None
    assert playlist_sha256(playlist) == (
        "eabec14135c2c9dad1b21d497ef260667de5cd450351a0be153d410108ad427a"
    )


# Hero runs: N candidates of one video's image, each its own paid item.

HERO_PLAYLIST = {
    "template": {"id": "cover", "version": 1, "prompt": "Cover art for '{title}'"},
    "items": [
        {"video_id": "v01", "title": "Morning Harbor", "seed": 1001, "hero": {"candidates": 4}},
        {"video_id": "v02", "title": "Night Market", "seed": 1002, "parts": [1, 2]},
    ],
}


def _hero(candidates: int | None = None) -> list:
    playlist = Playlist.model_validate(HERO_PLAYLIST)
    if candidates is not None:
        playlist = playlist.with_hero_candidates(candidates)
    return expand(playlist, [], "2026-W32-0", "weekly")


def test_hero_candidates_have_distinct_keys_and_growing_them_keeps_the_old_ones() -> None:
    four = _hero()
    candidates = [i for i in four if i.candidate is not None]
    assert [i.item_id for i in candidates] == ["v01.c1", "v01.c2", "v01.c3", "v01.c4"]
    assert [i.seed for i in candidates] == [1001, 105730, 210459, 315188]  # ordinal folded in
    assert all(i.part == 0 for i in candidates)
    assert len({i.idempotency_key for i in four}) == len(four) == 6
    six = _hero(6)
    keys_six = [i.idempotency_key for i in six]
    assert [i.idempotency_key for i in four] == [*keys_six[:4], *keys_six[6:]]
    assert len(set(keys_six)) == 8  # two more candidates, nothing else changed
    assert _hero(2)[:2] == four[:2]  # shrinking keeps the first ones too
    assert [i.idempotency_key for i in _hero()] == [i.idempotency_key for i in four]  # stable


def test_a_hero_key_follows_the_documented_rule() -> None:
    """The worked example of docs/playlist.md: candidate 2 of v01 in 2026-W32-0 (weekly)."""
    import hashlib
    import json

    template = Playlist.model_validate(HERO_PLAYLIST).template.spec_hash()
    payload = {
        "template": template,
        "profile": "fake",
        "item": "2026-W32-0/v01.hero",
        "part": None,
        "prompt": "Cover art for 'Morning Harbor'",
        "seed": 1001 + 104_729,
        "references": [],
        "candidate": 2,
    }
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    expected = hashlib.sha256(text.encode()).hexdigest()[:32]
    assert _hero()[1].idempotency_key == expected == "c828ee0b4ca0786e78c4bc2b33922f13"


def test_the_ordinal_is_in_the_key_even_where_the_seed_would_not_tell_candidates_apart() -> None:
    one = item_idempotency_key(**{**BASE, "part": None, "candidate": 1})
    two = item_idempotency_key(**{**BASE, "part": None, "candidate": 2})
    assert one != two != item_idempotency_key(**BASE)


def test_a_part_key_is_unchanged_by_hero_runs() -> None:
    """Keys recorded before hero runs existed stay the keys of the same images."""
    assert item_idempotency_key(**BASE) == item_idempotency_key(**{**BASE, "candidate": None})
    parts = [i for i in _hero() if i.candidate is None]
    without = {**HERO_PLAYLIST["items"][0], "hero": False}  # type: ignore[index]
    plain = Playlist.model_validate(
        {**HERO_PLAYLIST, "items": [without, HERO_PLAYLIST["items"][1]]}
    )  # type: ignore[index]
    plain_keys = [i.idempotency_key for i in expand(plain, [], "2026-W32-0", "weekly")]
    assert plain_keys[1:] == [i.idempotency_key for i in parts]
    assert plain_keys[0] == item_idempotency_key(  # v01 without its hero run: part 1
        template_spec_hash=plain.template.spec_hash(),
        provider_profile="fake",
        item_id="2026-W32-0/v01.p1",
        part=1,
        prompt="Cover art for 'Morning Harbor'",
        seed=1001,
        reference_sha256=[],
    )


def test_a_playlist_wide_hero_covers_one_image_videos_and_hero_false_opts_out() -> None:
    raw = {
        "template": {"id": "t", "version": 1, "prompt": "{title}"},
        "hero": {"candidates": 3},
        "items": [
            {"video_id": "a", "title": "x", "seed": 1},
            {"video_id": "b", "title": "y", "seed": 2, "hero": {"candidates": 2}},
            {"video_id": "c", "title": "z", "seed": 3, "parts": [1, 2], "hero": False},
        ],
    }
    items = expand(Playlist.model_validate(raw), [], "2026-W32-0", "weekly")
    assert [i.item_id for i in items] == ["a.c1", "a.c2", "a.c3", "b.c1", "b.c2", "c.p1", "c.p2"]
    for bad in (
        {**raw, "items": [{"video_id": "c", "title": "z", "seed": 3, "parts": [1, 2]}]},
        {**raw, "hero": {"candidates": 0}},
        {**raw, "hero": {"candidates": 51}},
        {**raw, "hero": {"candidates": True}},
        {**raw, "hero": True},
        {**raw, "hero": {"candidates": 2, "extra": 1}},
        {**raw, "items": [{"video_id": "a", "title": "x", "seed": 1, "hero": 0}]},
        {**raw, "items": [{"video_id": "a", "title": "x", "seed": 1, "hero": 0.0}]},
        {**raw, "items": [{"video_id": "a", "title": "x", "seed": 1, "hero": "false"}]},
        {**raw, "items": [{"video_id": "a", "title": "x", "seed": 1, "hero": 1}]},
        {
            **raw,
            "hero": None,
            "items": [
                {
                    "video_id": "c",
                    "title": "z",
                    "seed": 3,
                    "parts": [1, 2],
                    "hero": {"candidates": 2},
                }
            ],
        },
    ):
        with pytest.raises(ValueError):
            Playlist.model_validate(bad)


def test_hero_candidates_from_the_command_line() -> None:
    plain = Playlist.model_validate(
        {
            "template": {"id": "t", "version": 1, "prompt": "{title}"},
            "items": [
                {"video_id": "a", "title": "x", "seed": 1},
                {"video_id": "c", "title": "z", "seed": 3, "parts": [1, 2]},
            ],
        }
    )
    items = expand(plain.with_hero_candidates(2), [], "2026-W32-0", "weekly")
    assert [i.item_id for i in items] == ["a.c1", "a.c2", "c.p1", "c.p2"]
    only_parts = Playlist.model_validate(
        {**plain.model_dump(), "items": [plain.videos[1].model_dump()]}
    )
    with pytest.raises(InvalidInput, match="no video of the plan can be a hero"):
        only_parts.with_hero_candidates(2)
    for bad in (0, 51):
        with pytest.raises(InvalidInput):
            plain.with_hero_candidates(bad)
    # a playlist with a video's own hero run: only hero runs change, other videos keep parts
    grown = Playlist.model_validate(HERO_PLAYLIST).with_hero_candidates(6)
    assert grown.hero is None
    assert [i.item_id for i in expand(grown, [], "2026-W32-0", "weekly")] == [
        *(f"v01.c{n}" for n in range(1, 7)),
        "v02.p1",
        "v02.p2",
    ]


def test_picks_are_parsed_strictly_and_checked_against_the_plan() -> None:
    from episodic.core.playlist import check_picks, hero_candidates, parse_picks

    heroes = hero_candidates(_hero())
    assert parse_picks("v01=2") == {"v01": 2}
    assert check_picks({"v01": 4}, heroes) == {"v01": 4}
    for text in (
        "v01",
        "v01=",
        "v01=0",
        "v01=x",
        "v01=2,v01=3",
        "=2",
        "v01=2;",
        "v01=-1",
        "v01=1e3",
        "v01 = 2,",
        "v01=9999999",
        "v01=2\n",
        "v01=2\n,v02=1",
        "v01=\uff12",
        "\x1b[2Jv01=1",
    ):
        with pytest.raises(InvalidInput):
            parse_picks(text)
    for picks, message in (
        ({}, "no pick for v01"),
        ({"v01": 5}, "candidates 1-4; 5 is not one of them"),
        ({"v01": 1, "v02": 1}, "has no hero candidates"),
        ({"v01": 1, "zz": 1}, "has no hero candidates"),
    ):
        with pytest.raises(InvalidInput, match=message):
            check_picks(picks, heroes)


IDS = [f"v{n:02d}" for n in range(1, 13)]


def test_a_selection_takes_video_ids_as_well_as_positions() -> None:
    assert parse_selection("v03,v05", IDS) == {3, 5}
    assert parse_selection("2-4", IDS) == {2, 3, 4}
    assert parse_selection(" v12 , 1 ", IDS) == {1, 12}


def test_a_reversed_range_says_how_to_write_it() -> None:
    with pytest.raises(InvalidInput) as raised:
        parse_selection("3-1", IDS)
    assert "range 3-1 is reversed: write 1-3" in str(raised.value)
    assert "videos 1-12" not in str(raised.value)


def test_an_unknown_video_id_names_the_close_ones_and_the_valid_ones() -> None:
    with pytest.raises(InvalidInput) as raised:
        parse_selection("v3", IDS)
    message = str(raised.value)
    assert "no video 'v3' (close: " in message and "v03" in message, message
    assert "positions 1-12, or ids v01, v02, v03, v04, v05, ..., v12" in message, message
    with pytest.raises(InvalidInput, match="no video 13; the playlist has videos 1-12"):
        parse_selection("13", IDS)
