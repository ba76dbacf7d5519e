"""Where item results live: the cache that lets a retried flow run skip finished items."""

from __future__ import annotations

from pathlib import Path

from prefect.exceptions import ObjectNotFound
from prefect.filesystems import WritableFileSystem

from core.errors import ProviderConfigError
from core.settings import Settings


def result_storage(settings: Settings) -> str | Path:
    """Where item results (the cache that lets a retried flow skip finished items) live:
    the Prefect filesystem block named by EPISODIC_RESULT_STORAGE (a slug such as
    ``remote-file-system/shared-results``, for several machines), else the folder
    EPISODIC_HOME/results. Set on the task explicitly, so a worker's flow-run process (which
    imports Prefect before this project could set its defaults) uses it too."""
    return settings.result_storage or settings.results_path


def check_result_storage(settings: Settings) -> str:
    """Load the configured block now (a typo fails at setup, not in the middle of a run);
    returns a description of the storage. Raises `ProviderConfigError`."""
    if not settings.result_storage:
        return str(settings.results_path)
    load_result_storage(settings.result_storage)
    return settings.result_storage


def load_result_storage(slug: str) -> WritableFileSystem:
    """The Prefect filesystem block `slug` names (``block-type/name``), loaded from the API.
    Raises `ProviderConfigError` (one line, naming EPISODIC_RESULT_STORAGE) when it does
    not load or is not a writable filesystem block."""
    from prefect.blocks.core import Block

    try:
        block = Block.load(slug)
    except (ValueError, ObjectNotFound) as exc:
        raise ProviderConfigError(
            f"EPISODIC_RESULT_STORAGE: block {slug!r} does not load: {str(exc).splitlines()[0]}"
        ) from None
    if not isinstance(block, WritableFileSystem):
        raise ProviderConfigError(
            f"EPISODIC_RESULT_STORAGE: block {slug!r} is not a writable filesystem block"
        )
    return block
