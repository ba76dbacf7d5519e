"""Real filesystem faults for the media store's tests: a full disk, a read-only folder.

As root (this project's CI), each is a small tmpfs mounted over a fresh folder, removed at
the end: the kernel itself answers ENOSPC or EROFS. Without root, a read-only folder is a
folder without write permission, and a full disk is a child process whose file-size limit
(RLIMIT_FSIZE) is tiny: the kernel answers EFBIG, which the store treats as a full disk.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path


def can_mount() -> bool:
    return os.geteuid() == 0


def _mount(folder: Path, options: str) -> None:
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)],
        check=True,
        capture_output=True,
    )


def _umount(folder: Path) -> None:
    subprocess.run(["umount", str(folder)], check=True, capture_output=True)


@contextlib.contextmanager
def tiny_filesystem(folder: Path, size_kib: int = 64) -> Iterator[Path]:
    """`folder` on a filesystem of `size_kib` KiB (as root; see `full_disk_in_child`)."""
    folder.mkdir(parents=True, exist_ok=True)
    _mount(folder, f"size={size_kib}k,mode=0755")
    try:
        yield folder
    finally:
        _umount(folder)


@contextlib.contextmanager
def read_only_folder(folder: Path) -> Iterator[Path]:
    """An existing, empty `folder` nobody may write to (root included when mounted)."""
    folder.mkdir(parents=True, exist_ok=True)
    if can_mount():
        _mount(folder, "ro,size=64k")
        try:
            yield folder
        finally:
            _umount(folder)
        return
    folder.chmod(0o555)
    try:
        yield folder
    finally:
        folder.chmod(0o755)
