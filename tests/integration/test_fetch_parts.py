"""Several one-row reads in one statement (`dbapi.fetch_parts`): each part keeps its own
parameters and columns."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine

from episodic.storage import dbapi, tx


def test_each_part_answers_its_own_row_with_its_own_parameters(engine: Engine) -> None:
    parts = [
        dbapi.Part("SELECT :b_n + 1, :b_word", {"b_n": 1, "b_word": "one"}, 2),
        dbapi.Part("SELECT :b_n * 10", {"b_n": 7}, 1),  # the same name, another value
        dbapi.Part("SELECT count(*) FROM items WHERE id = :b_n", {"b_n": -1}, 1),
    ]
    with tx.read(engine) as conn:
        assert dbapi.fetch_parts(conn, parts) == [(2, "one"), (70,), (0,)]
        assert dbapi.fetch_parts(conn, []) == []


def test_a_part_that_counts_its_columns_wrong_is_refused(engine: Engine) -> None:
    with tx.read(engine) as conn, pytest.raises(AssertionError, match="columns"):
        dbapi.fetch_parts(conn, [dbapi.Part("SELECT 1, 2", {}, 1)])
