"""Writing a file at a path the user named (`preview --out`, the files `assemble --out`
copies): whole (a temporary file in the same folder, fsynced, renamed over the target), with
normal permissions (0666 minus the umask, like any file the project writes), and never over
something that is not a regular file. A rename replaces whatever the name points at: a
device (`--out /dev/null` run as root), a FIFO or a symlink would silently become a regular
file, so those are refused (InvalidInput: exit 2, one line) and left as they are."""

from __future__ import annotations

import contextlib
import os
import stat
import uuid
from pathlib import Path

from core.errors import InvalidInput


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


def write_output(path: Path, content: bytes, shown: str) -> None:
    """Write `content` to the user-named `path` whole, its folder made when missing;
    refused (InvalidInput, one line starting with `shown`, nothing written) when `path` is
    not a regular file (`refuse_odd_target`) or cannot be written."""
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
