"""Options shared by several commands, declared once."""

from __future__ import annotations

from typing import Annotated

import typer

JsonOption = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]
PipelineOption = Annotated[
    str | None,
    typer.Option("--pipeline", help="Pipeline name [default: EPISODIC_PIPELINE or 'weekly']."),
]
