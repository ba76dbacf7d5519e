"""The contact sheet and the cover (`pipeline.contact_sheet`): decoded with Pillow, measured.

The cover keeps 16:9 images in their shape (not squashed into 128 px squares,
nearest-neighbour, untitled) and titles them, and the sheet shows hero candidates side by
side before approval."""

from __future__ import annotations

import io

from PIL import Image, ImageChops

from episodic.pipeline import contact_sheet
from episodic.pipeline.contact_sheet import (
    BACKGROUND,
    COVER_TILE,
    ELLIPSIS,
    PREVIEW_TILE,
    Tile,
    compose,
    fit_text,
    font,
)
from episodic.pipeline.preview import PlanTexts, sheet_rows
from tests.images import episode_image as image


def png(size: tuple[int, int], colour: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, format="PNG")
    return out.getvalue()


def checkerboard(size: tuple[int, int]) -> bytes:
    """Black and white 1 px squares: a resampling filter that averages makes greys of them;
    nearest-neighbour keeps only black and white."""
    image = Image.new("L", size)
    image.putdata([255 * ((x + y) % 2) for y in range(size[1]) for x in range(size[0])])
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def decode(content: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(content))
    image.load()
    assert image.format == "PNG"
    return image.convert("RGB")


def drawn(image: Image.Image, box: tuple[int, int, int, int]) -> tuple[int, int, int, int] | None:
    """The bounding box (relative to `box`) of what is not background inside `box`."""
    region = image.crop(box)
    return ImageChops.difference(region, Image.new("RGB", region.size, BACKGROUND)).getbbox()


def caption_box(box: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    left, _, right, bottom = box
    return (left, bottom, right, bottom + PREVIEW_TILE.caption)


def test_a_16_9_image_keeps_16_9_letterboxed_in_a_square_and_a_portrait_tile_too() -> None:
    wide, tall, square = png((1600, 900)), png((900, 1600)), png((500, 500))
    content, placed = compose([[Tile(wide, "Wide", "v01.p1"), Tile(tall, "Tall", "v02.p1")]])
    sheet = decode(content)
    width, height = PREVIEW_TILE.width, PREVIEW_TILE.height
    assert sheet.size == (
        2 * PREVIEW_TILE.cell[0] + PREVIEW_TILE.gap,
        PREVIEW_TILE.cell[1] + PREVIEW_TILE.gap,
    )
    first, second = placed
    bbox = drawn(sheet, first.box)
    assert bbox == (0, 0, width, height)  # 16:9 fills the 16:9 box: nothing cut, nothing added
    bbox = drawn(sheet, second.box)
    assert bbox is not None
    w, h = bbox[2] - bbox[0], bbox[3] - bbox[1]
    assert h == height and abs(w / h - 9 / 16) < 0.01  # fitted inside, letterboxed left/right
    assert bbox[0] == (width - w) // 2  # centred
    assert second.image_box == (
        second.box[0] + bbox[0],
        second.box[1],
        second.box[0] + bbox[2],
        second.box[3],
    )
    cover = decode(contact_sheet.cover([Tile(square, "S", "v01.p1"), Tile(wide, "W", "v02")]))
    assert cover.width > cover.height  # two tiles in one row
    bbox = drawn(cover, (COVER_TILE.gap, COVER_TILE.gap, COVER_TILE.gap + 256, 6 + 144))
    assert bbox is not None and bbox[2] - bbox[0] == bbox[3] - bbox[1] == 144  # square stays


def test_images_are_resampled_with_lanczos_not_nearest_neighbour() -> None:
    content, (tile,) = compose([[Tile(checkerboard((640, 360)), "t", "v01.p1")]])
    colours = decode(content).crop(tile.image_box).convert("L").getcolors(256 * 256)
    assert colours is not None
    greys = sum(count for count, value in colours if 40 < value < 215)
    assert greys > 1000, colours[:10]  # nearest-neighbour makes none: only black and white


def test_hero_candidates_of_one_video_share_one_row_numbered_as_pick_numbers_them() -> None:
    outputs = [
        (image("v01", 1), png((160, 90))),
        (image("v02", 1), png((160, 90))),
        (image("v02", 2), png((160, 90))),
        (image("v03", 0, 1), png((160, 90), (10, 200, 10))),
        (image("v03", 0, 2), png((160, 90), (10, 10, 200))),
        (image("v03", 0, 3), png((160, 90), (200, 200, 10))),
        (image("v04", 0, 1), png((160, 90))),
        (image("v04", 0, 2), png((160, 90))),
    ]
    titles = {"v01": "One", "v02": "Two", "v03": "Three", "v04": "Four"}
    rows = sheet_rows(outputs, PlanTexts(titles, {}))
    assert [[t.label for t in row] for row in rows] == [
        ["v01.p1", "v02.p1", "v02.p2"],
        [
            "v03 candidate 1 (pick v03=1)",
            "v03 candidate 2 (pick v03=2)",
            "v03 candidate 3 (pick v03=3)",
        ],
        ["v04 candidate 1 (pick v04=1)", "v04 candidate 2 (pick v04=2)"],
    ]
    assert [t.title for t in rows[1]] == ["Three"] * 3
    content, placed = compose(rows)
    sheet = decode(content)
    heroes = [p for p in placed if p.row == 1]
    assert [p.column for p in heroes] == [0, 1, 2]
    assert len({p.box[1] for p in heroes}) == 1  # side by side: one top
    assert heroes[0].box[2] < heroes[1].box[0] < heroes[1].box[2] < heroes[2].box[0]
    centre = heroes[1].box[0] + PREVIEW_TILE.width // 2, heroes[1].box[1] + 90
    assert sheet.getpixel(centre) == (10, 10, 200)  # candidate 2 is the second of its row


def test_titles_are_drawn_under_each_tile_and_ellipsized_to_fit() -> None:
    content = png((160, 90))
    long = "A remarkably long video title that no tile of a contact sheet could ever hold " * 2
    untitled, (blank,) = compose([[Tile(content, "", "")]])
    titled, (placed,) = compose([[Tile(content, long, "v01.p1")]])
    assert drawn(decode(untitled), caption_box(blank.box)) is None
    assert drawn(decode(titled), caption_box(placed.box)) is not None
    assert decode(untitled).crop(blank.box) == decode(titled).crop(placed.box)  # image alike
    assert placed.title.endswith(ELLIPSIS) and long.startswith(placed.title[:-1])
    assert font(PREVIEW_TILE.title_px).getlength(placed.title) <= PREVIEW_TILE.width
    text_box = drawn(decode(titled), caption_box(placed.box))
    assert text_box is not None and text_box[2] <= PREVIEW_TILE.width


def test_a_non_latin_title_is_kept_whole_when_it_fits_and_cut_with_an_ellipsis_when_not() -> None:
    """Pillow's built-in font draws no Cyrillic or CJK glyph: such characters are drawn as
    its empty box (docs/generation.md), still inside the tile, and the label beside them
    names the video."""
    face = font(PREVIEW_TILE.title_px)
    assert fit_text("Привет, мир", face, PREVIEW_TILE.width) == "Привет, мир"
    cut = fit_text("東京の夜景と富士山の朝焼け、そして長い長い旅の記録" * 3, face, 200)
    assert cut.endswith(ELLIPSIS) and face.getlength(cut) <= 200
    content, (placed,) = compose([[Tile(png((160, 90)), "東京の夜景" * 20, "v01.p1")]])
    assert placed.title.endswith(ELLIPSIS)
    assert drawn(decode(content), caption_box(placed.box)) is not None
    assert fit_text("  two\tspaces\nand a line ", face, 300) == "two spaces and a line"


def test_the_same_tiles_make_the_same_bytes() -> None:
    tiles = [Tile(png((320, 180)), "t", "v01.p1"), Tile(checkerboard((90, 160)), "u", "v02.p1")]
    assert contact_sheet.cover(tiles) == contact_sheet.cover(list(tiles))
    assert compose([tiles])[0] == compose([tiles])[0]


def test_letters_the_font_lacks_are_drawn_as_their_base_letter_other_scripts_as_boxes() -> None:
    """Pillow's built-in font has no accented letters and no dashes: before, ``Café — Ü``
    was drawn ``Caf□ □ □``; now the reader sees ``Cafe - U``."""
    assert not contact_sheet.has_glyph("é") and contact_sheet.has_glyph("e")
    title = "Café — Straße über Łódź"
    assert contact_sheet.drawable(title) == "Cafe - Strasse uber Lodz"
    assert contact_sheet.drawable("Привет 東京") == "Привет 東京"  # no stand-in: boxes
    _, (placed,) = compose([[Tile(png((160, 90)), title, "v01.p1")]])
    assert placed.title == "Cafe - Strasse uber Lodz"
