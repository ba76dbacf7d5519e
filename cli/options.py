"""Options shared by several commands, declared once."""

from __future__ import annotations

from typing import Annotated

import typer

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
