"""Worker functions for the media store's multi-process tests (spawned processes)."""

from __future__ import annotations

import os
import traceback
from typing import Any


def put_worker(barrier: Any, url: str, env: dict[str, str], content: bytes, results: Any) -> None:
    """Released with every other worker, store the same image; report what the store said."""
    os.environ.update(env)
    try:
        from episodic.pipeline.media import prove_image
        from episodic.storage.media import MediaStore

        store = MediaStore.open(url, timeout_s=10, attempts=3)
        image = prove_image(content)
        barrier.wait(timeout=120)
        stored = store.put_image(image)
        results.put(["ok", stored.key, stored.sha256, stored.size])
    except Exception:
        results.put(["error", traceback.format_exc(limit=5)])


def full_disk_worker(folder: str, content: bytes, limit_bytes: int, results: Any) -> None:
    """With the file-size limit below `content`'s size, store it: the kernel refuses the
    write (EFBIG, SIGXFSZ ignored) as a full disk would; report the error and the files."""
    import resource
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))
    try:
        from episodic.pipeline.media import prove_image
        from episodic.storage.media import MediaStore

        store = MediaStore.open(folder)
        store.put_image(prove_image(content))
        results.put(["stored"])
    except Exception as exc:
        results.put([type(exc).__name__, str(exc), getattr(exc, "transient", None)])


def adopt_worker(barrier: Any, db_url: str, store_url: str, results: Any) -> None:
    """Released with the other worker, adopt `store_url` as the database's media store
    (what the first writing command does); report the recorded store id or the refusal."""
    try:
        from episodic.core.errors import WrongMediaStore
        from episodic.storage.engine import make_engine
        from episodic.storage.media import MediaStore
        from episodic.storage.store_identity import verify

        engine = make_engine(db_url)
        store = MediaStore.open(store_url, timeout_s=10, attempts=3)
        barrier.wait(timeout=120)
        try:
            results.put(["ok", store_url, verify(engine, store, adopt=True).store_id])  # type: ignore[union-attr]
        except WrongMediaStore as exc:
            results.put(["refused", store_url, str(exc)])
        engine.dispose()
    except Exception:
        results.put(["error", store_url, traceback.format_exc(limit=5)])
