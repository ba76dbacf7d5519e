"""Titles on the contact sheet and the cover."""

from __future__ import annotations

import unicodedata

from episodic.pipeline.contact_sheet import drawable, has_glyph


def test_a_decomposed_accent_is_drawn_as_its_base_letter_like_a_composed_one() -> None:
    """`Café` typed on macOS, or pasted from many web pages, is often NFD: `e` followed by
    U+0301 COMBINING ACUTE ACCENT. The composed `é` is drawn as `e`, but the lone combining
    mark has no glyph in the built-in font and no decomposition: left in, it would be drawn
    as an empty box after the letter (`Cafe□`; a stacked title, a box per mark)."""
    decomposed = unicodedata.normalize("NFD", "Café Müller")
    assert decomposed != "Café Müller"
    drawn = drawable(decomposed)
    assert all(has_glyph(char) for char in drawn), ascii(drawn)
    assert drawn == drawable("Café Müller") == "Cafe Muller"
