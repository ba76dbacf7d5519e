"""A file written at a path the user named (`preview --out`, the copies `assemble --out`
makes) replaces only a regular file: a FIFO, a device, a symlink or a folder there is
refused with one line and left as it is, and what is written has normal permissions."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from core.errors import InvalidInput
from core.output_files import write_output


def test_a_regular_file_is_replaced_whole_with_normal_permissions(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "sheet.png"
    write_output(target, b"first", "--out x")
    old = os.umask(0o022)
    try:
        write_output(target, b"second", "--out x")
    finally:
        os.umask(old)
    assert target.read_bytes() == b"second"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644  # not mkstemp's 0600
    assert sorted(p.name for p in target.parent.iterdir()) == ["sheet.png"]  # no temporary


@pytest.mark.parametrize("kind", ["fifo", "symlink to a file", "dangling symlink", "folder"])
def test_anything_but_a_regular_file_is_refused_and_left_as_it_is(
    tmp_path: Path, kind: str
) -> None:
    target = tmp_path / "out.png"
    pointed = tmp_path / "elsewhere.png"
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "symlink to a file":
        pointed.write_bytes(b"keep")
        target.symlink_to(pointed)
    elif kind == "dangling symlink":
        target.symlink_to(pointed)
    else:
        target.mkdir()
    before = target.lstat()
    with pytest.raises(InvalidInput, match=r"^--out x: ") as raised:
        write_output(target, b"png", "--out x")
    assert len(str(raised.value).splitlines()) == 1
    after = target.lstat()
    assert (after.st_ino, stat.S_IFMT(after.st_mode)) == (
        before.st_ino,
        stat.S_IFMT(before.st_mode),
    )
    if kind == "symlink to a file":
        assert pointed.read_bytes() == b"keep"
    if kind == "dangling symlink":
        assert not pointed.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        {target.name} | ({pointed.name} if pointed.exists() else set())
    )


def test_a_folder_that_is_a_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("a file")
    with pytest.raises(InvalidInput, match=r"^--out x: "):
        write_output(tmp_path / "notes.txt" / "sheet.png", b"png", "--out x")
