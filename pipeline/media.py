"""The images of a run: the proof that downloaded bytes are an image, and keeping them in
the media store before anything is completed.

The order every paid image follows (`episodic.pipeline.paid_call`): download, prove it is an image
(`prove_image`: its media type from the bytes, never from the reply's header or a file
name), write it to the media store under its content key and verify what the store holds
(`keep_image`), and only then complete the item in the ledger. The key is derived from the
bytes, so an image a reviewer saw or a ledger row names is never overwritten: another image
has another key.
"""

from __future__ import annotations

import hashlib
import io
import warnings

from PIL import Image, ImageFile, UnidentifiedImageError

from episodic.core.errors import NotAnImage
from episodic.core.media import ProvenImage, StoredMedia
from episodic.storage.media import MediaStore

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
        raise NotAnImage("an empty body")
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


def keep_image(store: MediaStore, image: ProvenImage) -> StoredMedia:
    """Write proven bytes to `store` under their content key (put-if-absent) and verify
    what it holds (size and sha256, re-read): the `StoredMedia` the ledger records.

    Raises `MediaStoreUnavailable` (outage, 5xx, full disk: the caller leaves the job
    accepted and collects it again), `MediaStoreMisconfigured`, or `MediaCorrupt` (another
    object under the key; left as it is)."""
    return store.put_image(image)
