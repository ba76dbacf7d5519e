"""Keeps the documented-commands tests on one xdist worker under ``make test``.

pytest-xdist 3.8's ``--dist loadgroup`` tags an item's group by rewriting ``item._nodeid``,
which pytest 9 no longer reads (the node id lives in ``item._id``), so ``xdist_group`` marks
are ignored and each worker would run its own copy of a file's blocks. This applies the
same tag where pytest 9 reads it; without ``--dist loadgroup``, or if pytest's internals
move again, it does nothing and the blocks still run correctly (each worker runs the blocks
a test needs, in order), only slower.
"""

from __future__ import annotations

import contextlib

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not getattr(config.option, "loadgroup", False):
        return
    with contextlib.suppress(ImportError, AttributeError, TypeError):
        from _pytest.nodeid import coerce_node_id  # type: ignore[import-not-found]

        for item in items:
            mark = item.get_closest_marker("xdist_group")
            if mark and mark.args and "@" not in item.nodeid:
                item._id = coerce_node_id(f"{item.nodeid}@{mark.args[0]}")  # type: ignore[attr-defined]
