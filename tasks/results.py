"""Where item results live: the cache that lets a retried flow run skip finished items.

Three places, in this order: the Prefect filesystem block EPISODIC_RESULT_STORAGE names;
else, with a remote media store (EPISODIC_MEDIA_URL ``s3://…``, ``gs://…``, ``az://…``), a
`RemoteFileSystem` block on the same URL under ``prefect-results/`` (`media_results`),
which `episodic prefect setup` saves; else the folder EPISODIC_HOME/results. A remote store
is what several machines share, so a flow run retried on another worker finds the results
where the first one left them, next to the images it paid for.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from prefect.exceptions import ObjectNotFound
from prefect.filesystems import WritableFileSystem

from episodic.core.errors import ProviderConfigError
from episodic.core.settings import Settings

RESULTS_PREFIX = "prefect-results"
_BLOCK_TYPE = "remote-file-system"


@dataclass(frozen=True)
class MediaResults:
    """The result storage block that goes with a remote media store: saved under ``slug``
    (``remote-file-system/episodic-results-<12 hex digits of the basepath's sha256>``, so
    two projects with different stores on one Prefect server never share one), rooted at
    ``basepath`` (the store's URL + ``/prefect-results``). The block holds no credential:
    s3fs, gcsfs and adlfs read them from the environment as the store does."""

    slug: str
    basepath: str

    @property
    def name(self) -> str:
        return self.slug.split("/", 1)[1]


def media_results(settings: Settings) -> MediaResults | None:
    """The result block for the remote media store EPISODIC_MEDIA_URL names, or None for a
    local store (a folder or ``file://``: results stay in EPISODIC_HOME/results)."""
    url = settings.media_url
    if url is None:
        return None
    scheme = urlsplit(url).scheme.lower()
    if len(scheme) <= 1 or scheme == "file":  # a plain path (or a Windows drive)
        return None
    basepath = f"{url.rstrip('/')}/{RESULTS_PREFIX}"
    digest = hashlib.sha256(basepath.encode()).hexdigest()[:12]
    return MediaResults(f"{_BLOCK_TYPE}/episodic-results-{digest}", basepath)


def result_storage(settings: Settings) -> str | Path:
    """Where item results (the cache that lets a retried flow skip finished items) live:
    the Prefect filesystem block named by EPISODIC_RESULT_STORAGE (a slug such as
    ``remote-file-system/shared-results``), else the block of a remote media store
    (`media_results`), else the folder EPISODIC_HOME/results. Set on the task explicitly, so
    a worker's flow-run process (which imports Prefect before this project could set its
    defaults) uses it too."""
    if settings.result_storage:
        return settings.result_storage
    shared = media_results(settings)
    return shared.slug if shared is not None else settings.results_path


def ensure_result_storage(settings: Settings) -> str:
    """`episodic prefect setup`'s part: with a remote media store and no
    EPISODIC_RESULT_STORAGE, save its `RemoteFileSystem` block unless one on the same
    basepath is there (kept as it is, with any options set on it); then check that the
    storage loads (`check_result_storage`). Idempotent. Returns the description."""
    shared = None if settings.result_storage else media_results(settings)
    if shared is not None:
        from prefect.blocks.core import Block
        from prefect.filesystems import RemoteFileSystem

        try:
            existing = Block.load(shared.slug)
        except (ValueError, ObjectNotFound):
            existing = None
        # a block already on this basepath is kept as it is (options set on it stay)
        if not isinstance(existing, RemoteFileSystem) or existing.basepath != shared.basepath:
            RemoteFileSystem(basepath=shared.basepath).save(shared.name, overwrite=True)
    return check_result_storage(settings)


def check_result_storage(settings: Settings) -> str:
    """Load the configured block now (a typo, or a remote store's block that setup has not
    saved yet, fails at setup, not in the middle of a run); returns a description of the
    storage (a slug, with the basepath of a media store's block; or a folder). Raises
    `ProviderConfigError`."""
    storage = result_storage(settings)
    if isinstance(storage, Path):
        return str(storage)
    load_result_storage(storage)
    shared = media_results(settings)
    if shared is not None and shared.slug == storage:
        return f"{storage} ({shared.basepath})"
    return storage


def load_result_storage(slug: str) -> WritableFileSystem:
    """The Prefect filesystem block `slug` names (``block-type/name``), loaded from the API.
    Raises `ProviderConfigError` (one line, naming EPISODIC_RESULT_STORAGE, or for a media
    store's block the command that saves it) when it does not load or is not a writable
    filesystem block."""
    from prefect.blocks.core import Block

    where = (
        "EPISODIC_RESULT_STORAGE"
        if not slug.startswith(f"{_BLOCK_TYPE}/episodic-results-")
        else "the media store's result storage (saved by `episodic prefect setup`)"
    )
    try:
        block = Block.load(slug)
    except (ValueError, ObjectNotFound) as exc:
        raise ProviderConfigError(
            f"{where}: block {slug!r} does not load: {str(exc).splitlines()[0]}"
        ) from None
    if not isinstance(block, WritableFileSystem):
        raise ProviderConfigError(f"{where}: block {slug!r} is not a writable filesystem block")
    return block
