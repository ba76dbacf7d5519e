"""Small inline previews of images (data URIs) for places that cannot reach our files, such
as the Prefect UI's approval form and artifacts rendered in the browser."""

from __future__ import annotations

import base64
import io
from pathlib import Path

from PIL import Image

THUMBNAIL_PX = 192  # longest side; about 5-10 KB per image as JPEG


def thumbnail_data_uri(path: Path, max_px: int = THUMBNAIL_PX) -> str | None:
    """A ``data:image/jpeg;base64,...`` preview of the image at `path`, at most `max_px` on
    its longest side; None when the file is missing or not an image Pillow can read."""
    try:
        with Image.open(path) as image:
            image.thumbnail((max_px, max_px))
            buffer = io.BytesIO()
            image.convert("RGB").save(buffer, format="JPEG", quality=75)
    except (OSError, ValueError, Image.DecompressionBombError):
        return None
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
