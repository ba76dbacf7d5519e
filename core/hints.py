"""Where a person reads our messages decides which next step they are told.

Errors and outcomes name the next step ("resume with ..."). On a terminal that is an
`episodic` command; in the Prefect UI it is a deployment to run. The flows set the surface
for their own context (`surface("prefect")`); everything else defaults to the CLI.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Literal

Surface = Literal["cli", "prefect"]
_surface: ContextVar[Surface] = ContextVar("episodic_surface", default="cli")


def hint(cli: str, prefect: str) -> str:
    """The next step worded for the current surface."""
    return prefect if _surface.get() == "prefect" else cli


@contextmanager
def surface(name: Surface) -> Iterator[None]:
    token = _surface.set(name)
    try:
        yield
    finally:
        _surface.reset(token)


def counted(number: int, noun: str, plural: str | None = None) -> str:
    """`number` and `noun`, in the plural unless it is one: ``counted(1, "item")`` is
    "1 item", ``counted(3, "new paid call")`` "3 new paid calls"."""
    return f"{number} {noun if number == 1 else (plural or noun + 's')}"
