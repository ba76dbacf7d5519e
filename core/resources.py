"""Files the product ships as package data: the example playlist and its reference files.

They live in the repository's ``examples/`` folder and install as ``episodic/examples`` (the
wheel maps the folder; a checkout links it), so the same call finds them in a clone, an
editable install and an installed wheel."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def example_playlist() -> Path:
    """The example playlist (``episodic/examples/playlist.yaml``), a real file on disk: its
    ``reference`` paths resolve beside it. Raises `FileNotFoundError` naming where it looked
    when the installation lacks it."""
    path = Path(str(files("episodic") / "examples" / "playlist.yaml"))  # installed as files
    if not path.is_file():
        raise FileNotFoundError(f"the example playlist is not installed: {path}")
    return path.resolve()
