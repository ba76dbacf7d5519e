"""Options shared by several commands, declared once."""

from __future__ import annotations

import re
from typing import Annotated, Any

import click
import typer

_ASCII_INT = re.compile(r"[0-9]{1,9}")


class StrictInt(click.IntRange):
    """A whole number of ASCII digits in a range: ``int()`` also reads ``٣`` (any Unicode
    digit), ``1_0`` and surrounding spaces, which a paid command's options must refuse."""

    name = "integer"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not _ASCII_INT.fullmatch(value):
            self.fail(f"{value!r} is not a whole number of ASCII digits", param, ctx)
        return super().convert(value, param, ctx)


JsonOption = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]
PipelineOption = Annotated[
    str | None,
    typer.Option("--pipeline", help="Pipeline name [default: EPISODIC_PIPELINE or 'weekly']."),
]
IdempotencyKeyOption = Annotated[
    str | None,
    typer.Option(
        "--idempotency-key",
        help="Your key for this request: a repeat within the dedup window joins the same run; "
        "the same key with other parameters is refused.",
    ),
]
AllowDuplicateOption = Annotated[
    bool,
    typer.Option(
        "--allow-duplicate",
        help="Start a parallel run even if the same request is active (items are still "
        "paid once: runs split them).",
    ),
]
BatchIdOption = Annotated[
    str | None,
    typer.Option("--batch-id", help="Parallel batches of one request get their own runs."),
]
