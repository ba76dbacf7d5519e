"""Printing for the CLI: human output on stdout, JSON for scripts, errors on stderr."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable, Sequence
from typing import Any


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


# Control characters (a newline, NUL, an escape sequence) and bidirectional overrides in a
# message are shown escaped: an error is always one line, and reads as what it is.
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
ERROR_LIMIT = 500  # characters of one error line


def one_line(message: str, limit: int = ERROR_LIMIT) -> str:
    """`message` as one printable line of at most `limit` characters (an input pasted by
    mistake may be kilobytes long, or carry newlines and terminal escapes)."""
    line = _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), message)
    return line if len(line) <= limit else f"{line[: limit - 20]}… ({len(line)} chars)"


def error(message: str) -> None:
    """One line on stderr: ``error: <message>``."""
    sys.stderr.write(f"error: {one_line(message)}\n")


def warning(message: str) -> None:
    """One line on stderr: ``warning: <message>``."""
    sys.stderr.write(f"warning: {one_line(message)}\n")


def table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    grid = Table(title=Text(title) if title else None, title_justify="left")
    for column in columns:
        grid.add_column(column)
    for row in rows:  # every cell is data (Text): no markup, no :emoji: codes, as typed
        grid.add_row(*(Text(str(cell)) for cell in row))
    console = Console()
    if not console.is_terminal:  # pipes and CI logs: do not squeeze into 80 columns
        console = Console(width=160)
    console.print(grid)
