"""The image files of a run: where an item's image is written, and how; and the proof that
downloaded bytes are an image before anything is stored or completed.

An image is content-addressed by its item key: another plan's image of the same video and
part has another key, so a file a reviewer saw or a ledger row points at is never
overwritten (going back to an earlier plan finds its images where they were).

`prove_image` is the first step of the order every paid image follows: download, prove it is
an image (its media type from the bytes, never from the reply's header or a file name),
write it to the media store under its content key, verify what the store holds, and only
then complete the item.
"""

from __future__ import annotations

import hashlib
import io
import os
import threading
import warnings
from pathlib import Path

from PIL import Image, ImageFile, UnidentifiedImageError

from core.errors import NotAnImage
from core.media import ProvenImage
from core.runs import Item

# Pillow's format names of the types a paid image may be, and their media types.
_FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp"}
# A PNG's last chunk: IEND, empty, with its fixed CRC. Pillow decodes every pixel of a PNG
# cut inside it, so the cut is caught here. (A JPEG's counterpart: its end-of-image marker
# FF D9 after its last scan FF DA; neither pair occurs inside entropy-coded data, where an
# FF is followed by 00. Pillow decodes a progressive JPEG that lacks only its EOI.)
_PNG_END = b"\x00\x00\x00\x00IEND\xaeB`\x82"


def prove_image(content: bytes) -> ProvenImage:
    """Decode `content` in full and say what it is.

    The bytes are identified (`Image.open`), structurally checked (`verify()`, which for a
    PNG checks every chunk's CRC) and then decoded to the last pixel (`load()` on a second
    open, as `verify()` leaves the image unusable), so a truncated body is refused.

    Returns a `ProvenImage` (media type ``image/png``, ``image/jpeg`` or ``image/webp``,
    width and height in pixels, sha256 hex, size in bytes). Raises `NotAnImage` with a short
    reason for an empty body, an HTML or other text page, another image format (GIF, ...),
    a truncated or corrupt image, or one too large to decode safely; the reason never
    echoes the bytes. Raises RuntimeError if this process set Pillow's
    ``LOAD_TRUNCATED_IMAGES``, under which a truncated image would pass.
    """
    if ImageFile.LOAD_TRUNCATED_IMAGES:
        raise RuntimeError(
            "PIL.ImageFile.LOAD_TRUNCATED_IMAGES is set in this process: truncated "
            "downloads would pass as images"
        )
    if not content:
        raise NotAnImage("the body is empty")
    media_type = _identify(content)
    if media_type == "image/png" and not content.endswith(_PNG_END):
        raise NotAnImage("a truncated PNG (it does not end with its IEND chunk)")
    if media_type == "image/jpeg" and content.rfind(b"\xff\xd9") < content.rfind(b"\xff\xda"):
        raise NotAnImage("a truncated JPEG (no end-of-image marker after its last scan)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(content), formats=list(_FORMATS)) as image:
                image.load()
                width, height = image.size
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise NotAnImage("the image is too large to decode safely") from None
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise NotAnImage(f"a truncated or corrupt {_label(media_type)} ({_short(exc)})") from None
    return ProvenImage(
        content=content,
        media_type=media_type,
        width=width,
        height=height,
        sha256=hashlib.sha256(content).hexdigest(),
        size=len(content),
    )


def _identify(content: bytes) -> str:
    """The media type of `content` from its bytes, after Pillow's structural check."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(content)) as image:
                found = image.format or "unknown"
                if found not in _FORMATS:
                    raise NotAnImage(f"a {found} image (accepted: PNG, JPEG, WEBP)")
                image.verify()
    except NotAnImage:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise NotAnImage("the image is too large to decode safely") from None
    except UnidentifiedImageError:
        raise NotAnImage(_unidentified(content)) from None
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise NotAnImage(f"a truncated or corrupt image ({_short(exc)})") from None
    return _FORMATS[found]


def _unidentified(content: bytes) -> str:
    head = content[:512].lstrip().lower()
    if head.startswith((b"<!doctype html", b"<html", b"<head", b"<body")):
        return "an HTML page, not an image"
    if head.startswith((b"<", b"{", b"[")):
        return "a text document (XML or JSON), not an image"
    return "not a PNG, JPEG or WEBP image (unrecognised bytes)"


def _label(media_type: str) -> str:
    return media_type.removeprefix("image/").upper()


def _short(exc: BaseException) -> str:
    """The exception's class and first line, bounded: Pillow's messages name byte counts
    and offsets, never the bytes."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text[:120]}" if text else type(exc).__name__


def image_path(folder: Path, item: Item) -> Path:
    """Where `item`'s image lives in the episode's image `folder`."""
    return folder / f"{item.item_id}.{item.idempotency_key}.png"


def write_atomically(path: Path, content: bytes) -> str:
    """Write `content` to `path` via a temporary file and rename; returns its sha256 (hex)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_bytes(content)
    os.replace(tmp, path)
    return hashlib.sha256(content).hexdigest()
