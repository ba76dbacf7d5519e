"""The image files of a run: where an item's image is written, and how.

An image is content-addressed by its item key: another plan's image of the same video and
part has another key, so a file a reviewer saw or a ledger row points at is never
overwritten (going back to an earlier plan finds its images where they were).
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

from core.runs import Item


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
