"""`prove_image`: real PNG, JPEG and WEBP from Pillow pass with their media type and size;
HTML, other formats, empty and every truncation of a real image are refused as NotAnImage,
and the reason never echoes the bytes."""

from __future__ import annotations

import hashlib
import io
import os

import pytest
from PIL import Image, ImageFile

from episodic.core.errors import NotAnImage
from episodic.core.media import content_key
from episodic.pipeline.media import prove_image


def encoded(fmt: str, size: tuple[int, int] = (40, 30), **options: object) -> bytes:
    buffer = io.BytesIO()
    Image.frombytes("RGB", size, os.urandom(size[0] * size[1] * 3)).save(
        buffer, format=fmt, **options
    )
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("fmt", "options", "media_type", "extension"),
    [
        ("PNG", {}, "image/png", "png"),
        ("JPEG", {}, "image/jpeg", "jpg"),
        ("JPEG", {"progressive": True}, "image/jpeg", "jpg"),
        ("WEBP", {}, "image/webp", "webp"),
        ("WEBP", {"lossless": True}, "image/webp", "webp"),
    ],
)
def test_real_images_are_proven_with_their_type_from_the_bytes(
    fmt: str, options: dict[str, object], media_type: str, extension: str
) -> None:
    content = encoded(fmt, **options)
    proven = prove_image(content)
    assert proven.media_type == media_type
    assert (proven.width, proven.height) == (40, 30)
    assert proven.sha256 == hashlib.sha256(content).hexdigest()
    assert proven.size == len(content) and proven.content == content
    assert "content" not in repr(proven)
    assert content_key(proven.sha256, proven.media_type).endswith("." + extension)


@pytest.mark.parametrize(
    ("fmt", "options"),
    [("PNG", {}), ("JPEG", {}), ("JPEG", {"progressive": True}), ("WEBP", {})],
)
def test_every_truncation_is_refused(fmt: str, options: dict[str, object]) -> None:
    """Each proper prefix of a real image (a body cut short at any byte) is not an image."""
    content = encoded(fmt, (24, 16), **options)
    passed = []
    for cut in range(len(content)):
        try:
            prove_image(content[:cut])
        except NotAnImage:
            continue
        passed.append(cut)
    assert passed == []


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"", "an empty body"),
        (b"<!DOCTYPE html><html><body>502 Bad Gateway</body></html>", "an HTML page"),
        (b"  <html><head><title>Error</title></head></html>", "an HTML page"),
        (b'{"error": "quota exceeded"}', "a text document"),
        (b"\x00\x01 definitely not an image \xff" * 8, "unrecognised bytes"),
    ],
)
def test_what_is_not_an_image_says_so_without_echoing_it(body: bytes, reason: str) -> None:
    with pytest.raises(NotAnImage, match=reason) as caught:
        prove_image(body)
    for fragment in (b"Bad Gateway", b"quota", b"definitely"):
        assert fragment.decode() not in str(caught.value)


@pytest.mark.parametrize("fmt", ["GIF", "BMP", "TIFF"])
def test_other_formats_are_refused_by_name(fmt: str) -> None:
    with pytest.raises(NotAnImage, match=f"a {fmt} image \\(accepted: PNG, JPEG, WEBP\\)"):
        prove_image(encoded(fmt))


def test_a_corrupt_png_is_refused() -> None:
    content = bytearray(encoded("PNG"))
    content[60] ^= 0xFF  # inside the image data: its chunk's CRC no longer matches
    with pytest.raises(NotAnImage, match="truncated or corrupt"):
        prove_image(bytes(content))


def test_a_process_that_loads_truncated_images_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    with pytest.raises(RuntimeError, match="LOAD_TRUNCATED_IMAGES"):
        prove_image(encoded("PNG"))
