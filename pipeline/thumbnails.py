"""Small inline previews of images (data URIs) for places that cannot reach our files, such
as the Prefect UI's approval form and artifacts rendered in the browser. The bytes come from
the media store, so a form rendered on any machine shows them."""

from __future__ import annotations

import base64
import io

from PIL import Image

THUMBNAIL_PX = 192  # longest side; about 5-10 KB per image as JPEG


def thumbnail_data_uri(content: bytes | None, max_px: int = THUMBNAIL_PX) -> str | None:
    """A ``data:image/jpeg;base64,...`` preview of the image `content` (its bytes), at most
    `max_px` on its longest side; None when there are no bytes or they are not an image
    Pillow can read."""
    if not content:
        return None
    try:
        with Image.open(io.BytesIO(content)) as image:
            image.thumbnail((max_px, max_px))
            buffer = io.BytesIO()
            image.convert("RGB").save(buffer, format="JPEG", quality=75)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        return None
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
