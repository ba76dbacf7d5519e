"""Printing for the CLI: human output on stdout, JSON for scripts, errors on stderr."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def error(message: str) -> None:
    sys.stderr.write(f"error: {message}\n")


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
