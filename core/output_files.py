"""Writing a file at a path the user named (`preview --out`, the files `assemble --out`
copies): whole (a temporary file in the same folder, fsynced, renamed over the target), with
normal permissions (0666 minus the umask, like any file the project writes), and never over
something that is not a regular file. A rename replaces whatever the name points at: a
device (`--out /dev/null` run as root), a FIFO or a symlink would silently become a regular
file, so those are refused (InvalidInput: exit 2, one line) and left as they are.

Nor does a user-named path ever write over the record (`RecordPaths`): the SQLite ledger and
its ``-wal``, ``-shm`` and ``-journal`` files, the providers file, and anything inside the
state folder or a local media store are refused (InvalidInput, one line naming what is
there), however the path reaches them: a relative path, ``..``, a symlinked folder on the
way (resolved), or another name of the same file or folder (a hard link, a bind mount:
compared by device and inode where it exists). Every writer of a user-named path takes the
guard: `write_output` requires it, and `RecordPaths.refuse` is the one check.

A folder the project itself chose inside the state folder (the demo's copies of what it
assembled) is not a user-named path: `RecordPaths.of(settings, state_folder=False)` lets it be
written inside the state folder and still keeps it off the ledger, the providers file and the
media store. `init` writes the providers file the same way: wherever the settings read it,
the state folder included, but never over the ledger or its companions nor into the store."""

from __future__ import annotations

import contextlib
import os
import re
import stat
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from episodic.core.errors import InvalidInput

if TYPE_CHECKING:
    from episodic.core.settings import Settings

_SQLITE_FILE_RE = re.compile(r"sqlite(?:\+\w+)?://[^/]*/([^?]+)")
# what SQLite keeps beside its database file (write-ahead log, shared memory, rollback journal)
LEDGER_COMPANIONS = ("-wal", "-shm", "-journal")


@dataclass(frozen=True, slots=True)
class Kept:
    """One part of the record: a file, or a folder with everything inside it (`tree`)."""

    path: Path
    what: str  # how the refusal names it ("the ledger", "the state folder", ...)
    tree: bool = False


@dataclass(frozen=True, slots=True)
class RecordPaths:
    """What no user-named output may write over (see the module)."""

    kept: tuple[Kept, ...] = ()

    @classmethod
    def of(
        cls, settings: Settings, *, state_folder: bool = True, providers_file: bool = True
    ) -> RecordPaths:
        """The record of the installation `settings` name: its state folder, its SQLite
        ledger (wherever ``EPISODIC_DATABASE_URL`` puts it) with SQLite's companion files,
        its providers file, and its media store when that is a local folder.

        `state_folder=False`: for a place the project chose inside the state folder (never
        one a user named), the state folder as a whole is left out; the files in it that
        are the record (the ledger, the providers file, a store kept there) are not.
        `providers_file=False`: for writing the providers file itself (`init`), which is
        then the one part of the record it may be."""
        from episodic.core.home import anchored
        from episodic.core.media import parse_store_url

        kept = []  # the most particular first: the refusal names it
        found = _SQLITE_FILE_RE.match(settings.url)
        if found and not found.group(1).startswith((":memory:", "file:")):
            ledger = Path(found.group(1))  # absolute: the settings refuse a relative one
            kept.append(Kept(ledger, "the ledger"))
            kept += [Kept(Path(f"{ledger}{end}"), "the ledger") for end in LEDGER_COMPANIONS]
        if providers_file:
            kept.append(Kept(settings.providers_path, "the providers file"))
        try:
            store = parse_store_url(settings.media_store_url)
        except InvalidInput:  # refused where the store is opened; nothing local to keep here
            store = None
        if store is not None and not store.scheme:
            kept.append(Kept(anchored(Path(store.path)), "the media store", tree=True))
        if state_folder:
            kept.append(Kept(settings.home_path, "the state folder", tree=True))
        return cls(tuple(kept))

    def refuse(self, path: Path, shown: str) -> None:
        """Raise InvalidInput (one line starting with `shown`) when writing `path` would
        write over a part of the record, or inside one kept with everything in it."""
        target = _resolved(path)
        target_id = _identity(target)
        folders = list(_ancestors(target))
        for kept in self.kept:
            where = _resolved(kept.path)
            where_id = _identity(where)
            same = target == where or (target_id is not None and target_id == where_id)
            inside = kept.tree and (
                where in target.parents or (where_id is not None and where_id in folders)
            )
            if same or inside:
                named = "is" if same else "is inside"
                raise InvalidInput(
                    f"{shown}: {named} {kept.what} ({kept.path}); nothing was written: name "
                    "a file outside it"
                )


def _resolved(path: Path) -> Path:
    """`path` absolute with every symlink on the way resolved (a missing tail kept as is)."""
    try:
        return path.expanduser().resolve(strict=False)
    except (OSError, RuntimeError):  # a symlink loop: compared as written
        return path.expanduser().absolute()


def _identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of what `path` names, or None when it does not exist."""
    try:
        found = path.stat()
    except (OSError, ValueError):
        return None
    return found.st_dev, found.st_ino


def _ancestors(path: Path) -> Iterator[tuple[int, int]]:
    """(device, inode) of each folder above `path` that exists (a bind mount of a kept
    folder is one of them)."""
    for folder in path.parents:
        found = _identity(folder)
        if found is not None:
            yield found


def refuse_odd_target(path: Path, shown: str) -> None:
    """Raise InvalidInput (one line starting with `shown`) when `path` exists and is not a
    regular file: a folder, a symlink (never followed nor replaced), a device, a FIFO or a
    socket. A missing `path` or a regular file passes."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise InvalidInput(f"{shown}: {exc.strerror or exc}") from None
    if stat.S_ISREG(mode):
        return
    if stat.S_ISLNK(mode):
        what = "is a symlink (not followed nor replaced); name a regular file"
    elif stat.S_ISDIR(mode):
        what = "is a folder; name the file to write"
    else:
        what = "exists and is not a regular file (a device, FIFO or socket); left as it is"
    raise InvalidInput(f"{shown}: {what}")


def write_output(path: Path, content: bytes, shown: str, *, keep: RecordPaths) -> None:
    """Write `content` to the user-named `path` whole, its folder made when missing;
    refused (InvalidInput, one line starting with `shown`, nothing written) when `path` is
    part of the record `keep` names (`RecordPaths.refuse`), is not a regular file
    (`refuse_odd_target`) or cannot be written."""
    keep.refuse(path, shown)
    refuse_odd_target(path, shown)
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(temporary, "xb") as handle:  # 0666 minus umask, as any file written
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        refuse_odd_target(path, shown)  # made meanwhile: still never replaced
        os.replace(temporary, path)
    except OSError as exc:
        raise InvalidInput(f"{shown}: {exc.strerror or exc}") from None
    finally:
        with contextlib.suppress(OSError):
            temporary.unlink()
