"""A run id may be typed as a unique prefix: `runs show|resume|cancel` and
`generate --resume` take its first 4+ characters; several runs or none: exit 2. Both backends."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, insert, select

from episodic.cli.app import run
from episodic.core.errors import InvalidInput
from episodic.core.ids import WeekId, parse_run_ref
from episodic.pipeline.allocation import allocate
from episodic.storage.models import EpisodeRow, RunRow
from episodic.storage.runs import RunStore

IDS = [
    "abcd1111-0000-4000-8000-000000000001",
    "abcd2222-0000-4000-8000-000000000002",
    "ef010000-0000-4000-8000-000000000003",
]


@pytest.fixture
def runs(engine: Engine) -> list[str]:
    episode_id = allocate(engine, "weekly", WeekId.parse("2026-W32"), "k").episode.episode_id
    with engine.begin() as conn:
        pk = conn.execute(
            select(EpisodeRow.id).where(EpisodeRow.episode_id == str(episode_id))
        ).scalar_one()
        for run_id in IDS:
            conn.execute(
                insert(RunRow).values(
                    id=run_id, episode_pk=pk, command="generate", state="failed", params={}
                )
            )
    return IDS


def test_a_unique_prefix_names_its_run(engine: Engine, runs: list[str]) -> None:
    store = RunStore(engine)
    assert store.run_id_starting("ef01") == IDS[2]
    assert store.run_id_starting("abcd1") == IDS[0]
    assert store.run_id_starting("abcd2222-0") == IDS[1]


def test_an_ambiguous_prefix_lists_the_runs_and_none_says_so(
    engine: Engine, runs: list[str]
) -> None:
    store = RunStore(engine)
    with pytest.raises(InvalidInput) as raised:
        store.run_id_starting("abcd")
    assert f"({IDS[0]}, {IDS[1]})" in str(raised.value) and "ambiguous" in str(raised.value)
    with pytest.raises(InvalidInput, match="no run starts with 0000"):
        store.run_id_starting("0000")
    with pytest.raises(InvalidInput, match="no run starts with"):
        store.run_id_starting("abc%")  # LIKE's wildcards are text here
    with pytest.raises(InvalidInput) as listed:
        store.run_id_starting("", shown_at_most=2)
    assert "more than 2 runs" in str(listed.value) and ", ...)" in str(listed.value)


def test_a_run_prefix_is_strict() -> None:
    assert parse_run_ref("ABCD") == ("abcd", True)
    assert parse_run_ref(IDS[0].upper()) == (IDS[0], False)
    for bad in ("abc", "abcg", "abcd-", "abcd1111_", "abcd11110", " abcd", "abcd%"):
        with pytest.raises(InvalidInput, match="invalid run id"):
            parse_run_ref(bad)


def test_the_cli_takes_a_run_prefix(
    engine: Engine, runs: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["runs", "show", "ef01", "--json"]) == 0
    assert IDS[2] in capsys.readouterr().out
    assert run(["runs", "show", "abcd"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ambiguous" in err[0] and IDS[1] in err[0], err
    assert run(["runs", "cancel", "9999"]) == 2
    assert "no run starts with 9999" in capsys.readouterr().err
    assert run(["runs", "resume", "abcd"]) == 2  # nothing resumed: the prefix names no one run
    assert "ambiguous" in capsys.readouterr().err
