"""A file written at a path the user named (`preview --out`, the copies `assemble --out`
makes) replaces only a regular file: a FIFO, a device, a symlink or a folder there is
refused with one line and left as it is, and what is written has normal permissions."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

import pytest

from episodic.core.errors import InvalidInput
from episodic.core.output_files import RecordPaths, write_output


def test_a_regular_file_is_replaced_whole_with_normal_permissions(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "sheet.png"
    write_output(target, b"first", "--out x", keep=RecordPaths())
    old = os.umask(0o022)
    try:
        write_output(target, b"second", "--out x", keep=RecordPaths())
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
        write_output(target, b"png", "--out x", keep=RecordPaths())
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
        write_output(tmp_path / "notes.txt" / "sheet.png", b"png", "--out x", keep=RecordPaths())


@dataclass
class Installation:
    home: Path
    store: Path
    ledger: Path
    conf: Path
    keep: RecordPaths


@pytest.fixture
def record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Installation:
    """An installation whose ledger, providers file and media store live outside its state
    folder, each made on disk, and the record paths its settings name."""
    from episodic.core.settings import load_settings

    home, store, conf = tmp_path / "home", tmp_path / "store", tmp_path / "conf"
    for folder in (home, store / "images", conf, tmp_path / "db"):
        folder.mkdir(parents=True)
    ledger = tmp_path / "db" / "ledger.db"
    for path in (ledger, Path(f"{ledger}-wal"), conf / "providers.yaml"):
        path.write_bytes(b"record")
    (store / "images" / "paid.png").write_bytes(b"record")
    (home / "notes.txt").write_bytes(b"record")
    monkeypatch.setenv("EPISODIC_HOME", str(home))
    monkeypatch.setenv("EPISODIC_DATABASE_URL", f"sqlite:///{ledger}")
    monkeypatch.setenv("EPISODIC_PROVIDERS_FILE", str(conf / "providers.yaml"))
    monkeypatch.setenv("EPISODIC_MEDIA_URL", f"file://{store}")
    return Installation(home, store, ledger, conf, RecordPaths.of(load_settings()))


def _targets(tmp_path: Path, record: Installation) -> dict[str, Path]:
    home, store, ledger, conf = record.home, record.store, record.ledger, record.conf
    (tmp_path / "via").symlink_to(tmp_path / "db")  # a symlinked folder on the way
    os.link(ledger, tmp_path / "alias.db")  # another name of the ledger's file
    return {
        "the ledger": ledger,
        "its write-ahead log": Path(f"{ledger}-wal"),
        "its shared memory (not there yet)": Path(f"{ledger}-shm"),
        "its journal (not there yet)": Path(f"{ledger}-journal"),
        "the providers file": conf / "providers.yaml",
        "a file in the state folder": home / "notes.txt",
        "a new file in the state folder": home / "episodes" / "x" / "sheet.png",
        "a store object": store / "images" / "paid.png",
        "the ledger by '..'": tmp_path / "conf" / ".." / "db" / "ledger.db",
        "the ledger through a symlinked folder": tmp_path / "via" / "ledger.db",
        "a hard link of the ledger": tmp_path / "alias.db",
    }


def test_no_user_named_output_writes_over_the_record(tmp_path: Path, record: Installation) -> None:
    """The ledger and its companions, the providers file, anything in the state folder or
    the local media store, however the path reaches them: one line naming what is there,
    exit 2 (InvalidInput), nothing written. A path outside them is written."""
    keep = record.keep
    for what, target in _targets(tmp_path, record).items():
        before = target.read_bytes() if target.exists() else None
        with pytest.raises(InvalidInput, match=r"^--out ") as raised:
            write_output(target, b"png", f"--out {target}", keep=keep)
        line = str(raised.value)
        assert len(line.splitlines()) == 1, (what, line)
        assert "nothing was written" in line, (what, line)
        assert (target.read_bytes() if target.exists() else None) == before, what
    assert record.ledger.read_bytes() == b"record"
    assert not (record.home / "episodes").exists()
    outside = tmp_path / "review" / "sheet.png"
    write_output(outside, b"png", "--out x", keep=keep)
    assert outside.read_bytes() == b"png"


def test_the_refusal_names_what_is_there(record: Installation) -> None:
    said = {}
    for target in (record.ledger, record.store / "images" / "paid.png"):
        with pytest.raises(InvalidInput) as raised:
            record.keep.refuse(target, "--out x")
        said[target.name] = str(raised.value)
    assert "is the ledger" in said["ledger.db"], said
    assert "is inside the media store" in said["paid.png"], said


def test_a_folder_the_project_chose_in_the_state_folder_is_written_but_never_the_record(
    tmp_path: Path, record: Installation
) -> None:
    """The demo's copies go to a folder of the state folder (the project's choice, not a
    user's): written there, while the ledger, the providers file and the store stay kept."""
    from episodic.core.settings import load_settings

    ours = RecordPaths.of(load_settings(), state_folder=False)
    target = record.home / "demo" / "2026-W49-0" / "cover.png"
    write_output(target, b"png", "demo", keep=ours)
    assert target.read_bytes() == b"png"
    for kept in (record.ledger, record.conf / "providers.yaml", record.store / "images" / "x"):
        with pytest.raises(InvalidInput, match="nothing was written"):
            ours.refuse(kept, "demo")
    with pytest.raises(InvalidInput, match="is inside the state folder"):
        record.keep.refuse(target, "--out x")  # a user naming the same folder: refused
