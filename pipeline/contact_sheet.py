"""Titled, aspect-correct tiles of images, composed into one PNG: the episode's cover and the
reviewer's contact sheet (`episodic preview`) are both made here, so what a reviewer sees is
drawn the way what ships is drawn.

Each tile is an image box (16:9) with the image fitted inside it (Lanczos resampling,
letterboxed on the background colour, never stretched) and two caption lines under it: the
video's title and a small label (item id, or a hero candidate's number). Text is drawn with
Pillow's built-in scalable font (`ImageFont.load_default(size=...)`, Aileron) and Pillow's
basic layout, never a font file of the machine, so the same inputs make the same bytes on
every machine with the same Pillow. That font draws basic Latin only: an accented letter is
drawn as its base letter (``Café`` as ``Cafe``), a dash as ``-`` (`drawable`), and a
character of another script (Cyrillic, CJK, ...) as the font's empty box: the video id beside
it still names the video, and the approval form (rendered by the browser) shows the title as
written. Text too wide for its tile is cut and ends with an ellipsis.

No database, no Prefect: `compose` takes the rows of tiles and answers the PNG bytes and
the layout (where each tile, its fitted image and its text went) as data.
"""

from __future__ import annotations

import io
import math
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from PIL import ImageFont

BACKGROUND = (16, 16, 16)
TEXT = (235, 235, 235)
LABEL = (150, 150, 150)
ELLIPSIS = "\u2026"


@dataclass(frozen=True, slots=True)
class TileSize:
    """A tile's geometry in pixels: the image box, the gap around it and the text sizes."""

    width: int = 320
    height: int = 180  # the image box: 16:9
    gap: int = 8
    title_px: int = 16
    label_px: int = 12

    @property
    def caption(self) -> int:
        """The height of the two caption lines under the image box."""
        return self.title_px + self.label_px + 3 * (self.gap // 2)

    @property
    def cell(self) -> tuple[int, int]:
        """The width and height one tile takes on the sheet, gaps included."""
        return self.width + self.gap, self.height + self.caption + self.gap


PREVIEW_TILE = TileSize()
COVER_TILE = TileSize(width=256, height=144, gap=6, title_px=14, label_px=11)


@dataclass(frozen=True, slots=True)
class Tile:
    """One image and its caption: `title` (the video's title) and `label` (small, secondary:
    the item id or the hero candidate's number)."""

    image: bytes
    title: str
    label: str


@dataclass(frozen=True, slots=True)
class Placed:
    """Where a tile went: `box` its image box, `image_box` the fitted image inside it (both
    (left, top, right, bottom)), and the caption text as drawn (ellipsized to fit)."""

    row: int
    column: int
    box: tuple[int, int, int, int]
    image_box: tuple[int, int, int, int]
    title: str
    label: str


@lru_cache(maxsize=8)
def font(size: int) -> ImageFont.FreeTypeFont:
    """Pillow's built-in scalable font at `size` px, with the basic layout (no libraqm: the
    same bytes whether the machine has it or not)."""
    from PIL import ImageFont

    loaded = ImageFont.load_default(size=size)
    if not isinstance(loaded, ImageFont.FreeTypeFont):  # Pillow without FreeType
        raise RuntimeError("Pillow was built without FreeType: titles cannot be drawn")
    return loaded.font_variant(layout_engine=ImageFont.Layout.BASIC)


# Stand-ins for characters the built-in font lacks and that have no plain-letter
# decomposition (an accented letter is drawn as its base letter: `drawable`).
_STAND_INS = {
    "\u2010": "-",
    "\u2011": "-",
    "\u2012": "-",
    "\u2013": "-",
    "\u2014": "-",
    "\u2015": "-",
    "\u2022": "\u00b7",
    "\u00df": "ss",
    "\u00f8": "o",
    "\u00d8": "O",
    "\u00e6": "ae",
    "\u00c6": "AE",
    "\u0153": "oe",
    "\u0152": "OE",
    "\u0142": "l",
    "\u0141": "L",
    "\u0111": "d",
    "\u0110": "D",
    "\u00fe": "th",
    "\u00de": "Th",
    "\u00d7": "x",
    "\u20ac": "EUR",
    "\u00bd": "1/2",
    "\u00bc": "1/4",
    "\u00be": "3/4",
    "\u00a1": "!",
    "\u00bf": "?",
    "\u00f7": "/",
}


@lru_cache(maxsize=4096)
def has_glyph(char: str) -> bool:
    """Whether the built-in font draws `char` as itself, not as its empty box (the glyph a
    font draws for what it lacks: drawn here for a private-use character, compared)."""
    from PIL import Image, ImageDraw

    def drawn(text: str) -> bytes:
        canvas = Image.new("L", (48, 48))
        ImageDraw.Draw(canvas).text((8, 8), text, fill=255, font=font(16))
        return canvas.tobytes()

    return drawn(char) != drawn("\U000f0000")


def drawable(text: str) -> str:
    """`text` with each character the built-in font lacks replaced, when it can be, by what
    it can draw: an accented letter by its base letter (``é`` -> ``e``, by Unicode
    decomposition, after composing a decomposed one: ``e`` + U+0301 is ``é``, then ``e``; a
    lone combining mark is dropped), a dash by ``-``, ``ß`` by ``ss``, ... Other scripts
    (Cyrillic, CJK, ...) stay as they are and are drawn as the font's empty boxes."""
    out = []
    for char in unicodedata.normalize("NFC", text):  # e + U+0301 (macOS, the web) is é
        if unicodedata.combining(char) and not has_glyph(char):
            continue  # a mark with no composed form (q + U+0301): its letter is drawn alone
        if has_glyph(char):
            out.append(char)
            continue
        plain = _STAND_INS.get(char) or "".join(
            part for part in unicodedata.normalize("NFKD", char) if not unicodedata.combining(part)
        )
        out.append(plain if plain and all(has_glyph(p) for p in plain) else char)
    return "".join(out)


def fit_text(text: str, face: ImageFont.FreeTypeFont, width: int) -> str:
    """`text` on one line (whitespace runs made one space), cut to fit `width` px and
    ending with an ellipsis when it was cut."""
    text = " ".join(text.split())
    if face.getlength(text) <= width:
        return text
    low, high = 0, len(text)  # the longest prefix that fits with the ellipsis
    while low < high:
        middle = (low + high + 1) // 2
        if face.getlength(text[:middle].rstrip() + ELLIPSIS) <= width:
            low = middle
        else:
            high = middle - 1
    return text[:low].rstrip() + ELLIPSIS


def fitted(size: tuple[int, int], box: tuple[int, int]) -> tuple[int, int]:
    """The largest size of `size`'s aspect ratio that fits inside `box` (at least 1 px)."""
    width, height = size
    scale = min(box[0] / width, box[1] / height)
    return max(1, round(width * scale)), max(1, round(height * scale))


def compose(rows: list[list[Tile]], size: TileSize = PREVIEW_TILE) -> tuple[bytes, list[Placed]]:
    """A PNG of `rows` of tiles (row by row, left to right) and where each tile went. The
    sheet is as wide as the longest row. Same inputs, same bytes."""
    from PIL import Image, ImageDraw

    if not any(rows):
        raise ValueError("a contact sheet needs at least one image")
    cell_w, cell_h = size.cell
    columns = max(len(row) for row in rows)
    sheet = Image.new(
        "RGB", (columns * cell_w + size.gap, len(rows) * cell_h + size.gap), BACKGROUND
    )
    draw = ImageDraw.Draw(sheet)
    title_face, label_face = font(size.title_px), font(size.label_px)
    placed = []
    for r, row in enumerate(rows):
        for c, tile in enumerate(row):
            left, top = size.gap + c * cell_w, size.gap + r * cell_h
            box = (left, top, left + size.width, top + size.height)
            with Image.open(io.BytesIO(tile.image)) as image:
                image.load()
                w, h = fitted(image.size, (size.width, size.height))
                thumb = image.convert("RGB").resize((w, h), Image.Resampling.LANCZOS)
            x, y = left + (size.width - w) // 2, top + (size.height - h) // 2
            sheet.paste(thumb, (x, y))
            title = fit_text(drawable(tile.title), title_face, size.width)
            label = fit_text(drawable(tile.label), label_face, size.width)
            text_top = top + size.height + size.gap // 2
            draw.text((left, text_top), title, fill=TEXT, font=title_face)
            draw.text(
                (left, text_top + size.title_px + size.gap // 2),
                label,
                fill=LABEL,
                font=label_face,
            )
            placed.append(Placed(r, c, box, (x, y, x + w, y + h), title, label))
    out = io.BytesIO()
    sheet.save(out, format="PNG", optimize=False)
    return out.getvalue(), placed


def grid(tiles: list[Tile], columns: int | None = None) -> list[list[Tile]]:
    """`tiles` in rows of `columns` (default: a near-square grid, ceil(sqrt(n)))."""
    columns = columns or max(1, math.ceil(math.sqrt(len(tiles))))
    return [tiles[n : n + columns] for n in range(0, len(tiles), columns)]


def cover(tiles: list[Tile]) -> bytes:
    """The episode's cover: the shipped images' tiles in a near-square grid, in playlist
    order."""
    content, _ = compose(grid(tiles), COVER_TILE)
    return content


LEGACY_THUMB = 128


def untitled_cover(images: list[bytes]) -> bytes:
    """The cover as assembly made it before titled tiles: 128 px squares, nearest-neighbour,
    no titles. Kept only so that reassembling an episode assembled back then makes the very
    bytes it recorded (rerunning an assembly changes nothing); new covers are `cover`."""
    from PIL import Image

    columns = math.ceil(math.sqrt(len(images)))
    rows = math.ceil(len(images) / columns)
    sheet = Image.new("RGB", (columns * LEGACY_THUMB, rows * LEGACY_THUMB), BACKGROUND)
    for n, content in enumerate(images):
        with Image.open(io.BytesIO(content)) as image:
            thumb = image.convert("RGB").resize(
                (LEGACY_THUMB, LEGACY_THUMB), Image.Resampling.NEAREST
            )
        sheet.paste(thumb, ((n % columns) * LEGACY_THUMB, (n // columns) * LEGACY_THUMB))
    out = io.BytesIO()
    sheet.save(out, format="PNG", optimize=False)
    return out.getvalue()
