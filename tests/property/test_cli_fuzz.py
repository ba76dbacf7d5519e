"""Bad input at the command line: every command, with malformed ids, keys,
numbers (NaN, inf, huge, negative, non-ASCII digits), NUL bytes, 10 KB strings and markup in
every position, answers with one line and a documented exit code; never a traceback, never
"unexpected", and nothing is written (the database is unchanged).

The CLI runs in this process (`episodic.cli.app.run`, as the `episodic` script does) so that
hypothesis can try hundreds of inputs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from episodic.cli.app import run
from episodic.core.exit_codes import ExitCode

NASTY = st.one_of(
    st.sampled_from(
        [
            "",
            " ",
            "nan",
            "NaN",
            "inf",
            "-inf",
            "1e999",
            "-1",
            "0",
            "99999999999999999999999",
            "\u0661\u0662",  # Arabic-Indic digits
            "\uff11",  # a fullwidth 1
            "a\x00b",
            "x" * 10_000,
            "[bold red]boom[/]",
            "[/x]",
            "'; DROP TABLE episodes; --",
            "../../etc/passwd",
            "2026-W32-0\n",
            "2026-W99-1",
            "2026-W32--1",
            "٢٠٢٦-W32-0",
            "00000000-0000-0000-0000-000000000000",
            "%s%s%s",
            "\u202e",
        ]
    ),
    st.text(max_size=40),
)

# Each command with the positions that take outside input ({} is filled with a bad value).
COMMANDS = [
    ["allocate", "--key", "{}", "--week", "2026-W32"],
    ["allocate", "--key", "k", "--week", "{}"],
    ["allocate", "--key", "k", "--at", "{}"],
    ["plan", "{}", "--playlist", "p.yaml"],
    ["plan", "2026-W32-0", "--playlist", "{}"],
    ["generate", "{}"],
    ["generate", "2026-W32-0", "--concurrency", "{}", "--plan"],
    ["generate", "2026-W32-0", "--max-images", "{}", "--plan"],
    ["generate", "2026-W32-0", "--max-cost", "{}", "--plan"],
    ["generate", "2026-W32-0", "--collect-timeout", "{}", "--plan"],
    ["generate", "2026-W32-0", "--only", "{}", "--plan"],
    ["generate", "2026-W32-0", "--resume", "{}"],
    ["generate", "2026-W32-0", "--hero-candidates", "{}", "--plan"],
    ["retry", "{}"],
    ["approve", "{}", "--by", "me"],
    ["approve", "2026-W32-0", "--by", "{}"],
    ["approve", "2026-W32-0", "--by", "me", "--pick", "{}"],
    ["assemble", "{}"],
    ["reopen", "{}", "--by", "me", "--reason", "r"],
    ["check", "{}"],
    ["episodes", "show", "{}"],
    ["episodes", "list", "--week", "{}"],
    ["runs", "show", "{}"],
    ["runs", "resume", "{}"],
    ["runs", "cancel", "{}"],
    ["runs", "list", "--episode", "{}"],
    ["migrate-legacy", "{}"],
    ["dispatch", "{}"],
    ["pipelines", "show", "{}"],
    ["{}"],
]
DOCUMENTED = {int(code) for code in ExitCode}


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An embedded database with one allocated episode (nothing planned)."""
    monkeypatch.setenv("EPISODIC_HOME", str(tmp_path))
    monkeypatch.delenv("EPISODIC_DATABASE_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    assert run(["allocate", "--key", "fuzz", "--week", "2026-W32"]) == 0
    return tmp_path


def _rows(home: Path) -> tuple[int, ...]:
    from episodic.storage.engine import make_engine

    engine = make_engine(f"sqlite:///{home / 'episodic.db'}")
    with engine.connect() as conn:
        counts = tuple(
            int(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())
            for table in (
                "episodes",
                "episode_events",
                "episode_plans",
                "runs",
                "items",
                "submissions",
            )
        )
    engine.dispose()
    return counts


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(template=st.sampled_from(COMMANDS), value=NASTY)
# What the fuzz found, kept as cases: a usage error printed click's four-line usage block; a
# NUL byte in a path and a 10 KB path ended "unexpected ValueError/OSError" (exit 1).
@example(template=["generate", "2026-W32-0", "--concurrency", "{}", "--plan"], value="")
@example(template=["migrate-legacy", "{}"], value="a\x00b")
@example(template=["migrate-legacy", "{}"], value="x" * 10_000)
@example(template=["allocate", "--key", "{}", "--week", "2026-W32"], value="k\nk")
def test_bad_input_is_one_line_with_a_documented_exit_code(
    home: Path, capsys: pytest.CaptureFixture[str], template: list[str], value: str
) -> None:
    before = _rows(home)
    argv = [value if part == "{}" else part for part in template]
    capsys.readouterr()
    code = run(argv)
    out, err = capsys.readouterr()
    assert code in DOCUMENTED, (argv, code, err)
    assert "Traceback (most recent call last)" not in out + err, (argv, err)
    assert "unexpected" not in err, (argv, err)
    if code != 0:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (argv, code, err[:2000])
        assert len(lines[0]) < 600, (argv, lines[0][:200])  # long input is clipped
        if template[0] in ("allocate", "plan", "generate", "approve", "reopen"):
            # a refused command wrote nothing (allocate with a fresh valid key may write)
            assert _rows(home) == before, (argv, code)


@pytest.mark.parametrize("value", ["\u0663", "1_0", " 3", "3 ", "+3", "\uff13"])
@pytest.mark.parametrize(
    "option",
    ["--concurrency", "--max-retries", "--collect-timeout", "--max-images", "--hero-candidates"],
)
def test_integer_options_take_ascii_digits_only(
    home: Path, capsys: pytest.CaptureFixture[str], option: str, value: str
) -> None:
    """``int()`` reads any Unicode digit, underscores and spaces (`--max-retries ٣` would
    run as 3): every integer option takes ASCII digits only."""
    capsys.readouterr()
    code = run(["generate", "2026-W32-0", "--plan", option, value])
    err = capsys.readouterr().err
    assert code == ExitCode.REFUSED, err
    assert f"'{option}'" in err and "ASCII digits" in err, err


@pytest.mark.parametrize("moment", ["9999-12-31T23:59:59-14:00", "0001-01-01T00:00:00+14:00"])
def test_a_moment_without_a_week_in_range_is_refused(
    home: Path, capsys: pytest.CaptureFixture[str], moment: str
) -> None:
    """It ended "unexpected OverflowError" (exit 1): the week of a moment is read in UTC."""
    before = _rows(home)
    capsys.readouterr()
    code = run(["allocate", "--key", "edge", "--at", moment])
    err = capsys.readouterr().err
    assert code == ExitCode.REFUSED and "outside the years" in err, err
    assert _rows(home) == before


@pytest.mark.parametrize("delay", ["nan", "1e3", "-5", "10_000", "99999999", "4" + "0" * 5000])
def test_a_bad_fake_provider_delay_is_a_configuration_error(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, delay: str
) -> None:
    from tests.generation import write_playlist

    assert run(["plan", "2026-W32-0", "--playlist", str(write_playlist(home / "pl", ["a"]))]) == 0
    before = _rows(home)
    monkeypatch.setenv("EPISODIC_FAKE_DELAY_MS", delay)
    capsys.readouterr()
    code = run(["generate", "2026-W32-0"])
    err = capsys.readouterr().err
    assert code == ExitCode.REFUSED and "EPISODIC_FAKE_DELAY_MS" in err, err
    assert len(err.strip().splitlines()) == 1
    assert _rows(home) == before
