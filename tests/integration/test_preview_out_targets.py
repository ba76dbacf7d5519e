"""`episodic preview --out` against odd targets: the sheet is written to a temporary file
renamed over `--out` only when `--out` is a regular file or does not exist."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from episodic.core.errors import InvalidInput
from tests.generation import Episode
from tests.integration.test_preview import generated, run_preview

__all__ = ["generated"]  # a fixture, re-used


def test_preview_out_naming_a_fifo_or_device_never_replaces_it(
    generated: Episode, tmp_path: Path
) -> None:
    """`--out /dev/null` run as root must not replace the system's /dev/null with a regular
    file holding the PNG (every later `> /dev/null` of the machine would write into it). A
    FIFO stands in for the device here (no root needed): refused with one line (not a
    regular file), the FIFO left as it is."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(InvalidInput, match="--out"):
        run_preview(generated, fifo)
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
