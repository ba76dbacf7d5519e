"""The fake provider writes two things a user names by environment: its event log
(``EPISODIC_FAKE_PROVIDER_LOG``, one JSON line appended per event) and its job store
(``EPISODIC_FAKE_PROVIDER_DIR``). Like every user-named output they never write over the
record: named onto the SQLite ledger (or its write-ahead log), the providers file or the local
media store, a paid command is refused in one line (exit 2) before any job, and the ledger is
the same file, byte for byte, readable after."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from episodic.core.exit_codes import ExitCode
from episodic.core.settings import load_settings
from tests.databases import SqliteDatabases
from tests.generation import new_episode, write_playlist


def _digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


@pytest.mark.parametrize("variable", ["EPISODIC_FAKE_PROVIDER_LOG", "EPISODIC_FAKE_PROVIDER_DIR"])
@pytest.mark.parametrize("target", ["the ledger", "the providers file", "the media store"])
def test_the_fake_providers_log_and_store_never_write_over_the_record(
    sqlite_databases: SqliteDatabases,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    variable: str,
    target: str,
) -> None:
    from episodic.cli.app import run
    from episodic.core.media import parse_store_url
    from episodic.storage.engine import make_engine

    url = sqlite_databases.fresh(tmp_path / "home")  # a file: the ledger a path can name
    monkeypatch.setenv("EPISODIC_DATABASE_URL", url)
    engine = make_engine(url)
    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "pl", ["owl"]))
    settings = load_settings()
    ledger = Path(url.removeprefix("sqlite:///"))
    store = Path(parse_store_url(settings.media_store_url).path)
    store.mkdir(parents=True, exist_ok=True)
    settings.providers_path.write_text("profiles: {}\n")
    path = {
        "the ledger": ledger,
        "the providers file": settings.providers_path,
        "the media store": store / "events.jsonl",
    }[target]
    before = _digest(path)
    log = tmp_path / "provider.jsonl"
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(log))
    monkeypatch.setenv(variable, str(path))
    capsys.readouterr()
    code = run(["generate", episode.episode_id])
    said = capsys.readouterr().err.strip().splitlines()
    assert code == ExitCode.REFUSED, said
    assert len(said) == 1 and variable in said[0] and target in said[0], said
    assert _digest(path) == before, f"{target} was written"
    assert not log.exists() or '"submit"' not in log.read_text()  # no job was made
    monkeypatch.delenv(variable)
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(log))
    assert run(["generate", episode.episode_id]) == ExitCode.OK  # the record is intact
