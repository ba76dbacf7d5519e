"""The SQL log's normalising and comparing (tests/sqllog.py), on hand-made recordings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import sqllog


@pytest.mark.parametrize(
    ("raw", "normalised"),
    [
        ("SELECT  a\n   FROM t\tWHERE id = ?", "SELECT a FROM t WHERE id = ?"),
        ("DELETE FROM t WHERE id IN (?, ?, ?)", "DELETE FROM t WHERE id IN (<list>)"),
        ("SELECT 1 FROM t WHERE id IN (%(id_1_1)s)", "SELECT 1 FROM t WHERE id IN (<list>)"),
        (  # PostgreSQL's expanded list casts each parameter
            "SELECT 1 FROM t WHERE k IN (%(k_1_1)s::VARCHAR, %(k_1_2)s::VARCHAR) AND e = 1",
            "SELECT 1 FROM t WHERE k IN (<list>) AND e = 1",
        ),
        (
            "INSERT INTO t (a, b) VALUES (%(a__0)s, %(b__0)s), (%(a__1)s, %(b__1)s) RETURNING t.id",
            "INSERT INTO t (a, b) VALUES <rows> RETURNING t.id",
        ),
        ("INSERT INTO t (a) VALUES (:a)", "INSERT INTO t (a) VALUES <rows>"),
        ("INSERT INTO t (s) VALUES ('done')", "INSERT INTO t (s) VALUES ('done')"),
        ('CREATE DATABASE "episodic_t_3fa9c2d1e0"', 'CREATE DATABASE "episodic_t_<hex>"'),
        ('DROP DATABASE "episodic_t_3fa9c2d1e0_copy"', 'DROP DATABASE "episodic_t_<hex>_copy"'),
        (
            "SELECT 1 WHERE id = '6f1c8a52-1b2c-4d3e-9f00-0123456789ab'",
            "SELECT 1 WHERE id = '<uuid>'",
        ),
        ("ATTACH '/tmp/pytest-of-root/x/db.sqlite' AS o", "ATTACH '<tmp>' AS o"),
        (
            "UPDATE items SET state = 'running' WHERE state IN ('pending', 'failed')",
            "UPDATE items SET state = 'running' WHERE state IN ('pending', 'failed')",
        ),
    ],
)
def test_normalise_hides_what_varies_and_keeps_state_names(raw: str, normalised: str) -> None:
    assert sqllog.normalise(raw) == normalised


def _recording(directory: Path, log: dict[str, dict[str, list[str]]]) -> Path:
    directory.mkdir()
    (directory / "gw0.json").write_text(json.dumps(log))
    return directory


BASE = {
    "t.py::a[sqlite]": {"sqlite": ["SELECT 1", "UPDATE x SET s = 'done'"]},
    "t.py::b[postgres]": {"postgresql": ["SELECT 2"]},
}


def test_an_identical_recording_compares_identical(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _recording(tmp_path / "before", BASE)
    after = tmp_path / "after"
    after.mkdir()  # the same statements, split over a worker file and a child's lines
    (after / "gw1.json").write_text(json.dumps({"t.py::a[sqlite]": BASE["t.py::a[sqlite]"]}))
    line = {"test": "t.py::b[postgres]", "backend": "postgresql", "sql": "SELECT 2"}
    (after / "child-1-1.jsonl").write_text(json.dumps(line) + "\n")
    assert sqllog.main(["compare", str(before), str(after)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "sqllog: identical"


def test_a_changed_statement_is_a_diff(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = _recording(tmp_path / "before", BASE)
    changed = {**BASE, "t.py::a[sqlite]": {"sqlite": ["SELECT 1", "UPDATE x SET s = 'gone'"]}}
    after = _recording(tmp_path / "after", changed)
    assert sqllog.main(["compare", str(before), str(after)]) == 1
    out = capsys.readouterr().out
    assert "t.py::a[sqlite] [sqlite]: 1 added, 1 removed" in out
    assert "+ UPDATE x SET s = 'gone'" in out and "- UPDATE x SET s = 'done'" in out
    assert out.splitlines()[-1] == "sqllog: differs"


def test_what_differs_between_two_base_recordings_is_noise_not_a_diff(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _recording(tmp_path / "before", BASE)
    retried = {**BASE, "t.py::b[postgres]": {"postgresql": ["SELECT 2", "ROLLBACK"]}}
    before2 = _recording(tmp_path / "before2", retried)
    after = _recording(tmp_path / "after", BASE)
    assert sqllog.main(["compare", str(before), str(after), "--noise", str(before2)]) == 0
    out = capsys.readouterr().out
    assert "~ ROLLBACK" in out and out.splitlines()[-1] == "sqllog: identical"
    # Noise hides a missing statement, never one the base trees never issued.
    new = {**BASE, "t.py::b[postgres]": {"postgresql": ["SELECT 2", "SELECT 3"]}}
    after2 = _recording(tmp_path / "after2", new)
    assert sqllog.main(["compare", str(before), str(after2), "--noise", str(before2)]) == 1


def test_a_test_missing_after_is_a_diff(tmp_path: Path) -> None:
    before = _recording(tmp_path / "before", BASE)
    after = _recording(tmp_path / "after", {"t.py::a[sqlite]": BASE["t.py::a[sqlite]"]})
    assert sqllog.main(["compare", str(before), str(after)]) == 1


def test_a_create_tables_constraints_compare_in_any_order() -> None:
    fk, pk = "CONSTRAINT fk_b FOREIGN KEY(b) REFERENCES u (id)", "CONSTRAINT pk_t PRIMARY KEY (a)"
    one = f"CREATE TABLE t ( a INT, b INT, {fk}, {pk} )"
    two = f"CREATE TABLE t ( a INT, b INT, {pk}, {fk} )"
    assert sqllog.normalise(one) == sqllog.normalise(two)
    swapped = f"CREATE TABLE t ( b INT, a INT, {pk}, {fk} )"
    assert sqllog.normalise(swapped) != sqllog.normalise(one)  # the columns keep their order
