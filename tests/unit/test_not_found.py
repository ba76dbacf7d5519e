"""A "not found" names the database it looked in, never its password."""

from __future__ import annotations

import pickle
from pathlib import Path

from sqlalchemy.engine import make_url

from episodic.core.errors import EpisodeNotFound, RunNotFound
from episodic.storage.engine import database_label, make_engine


def test_sqlite_is_named_by_its_file(tmp_path: Path) -> None:
    path = tmp_path / "state" / "episodic.db"
    writer = make_engine(f"sqlite:///{path}")
    with writer.connect():  # the file exists: a reader never creates it
        pass
    reader = make_engine(f"sqlite:///{path}", read_only=True)  # a URI filename underneath
    try:
        assert database_label(writer) == database_label(reader) == str(path)
        with writer.connect() as conn:
            assert database_label(conn) == str(path)
    finally:
        writer.dispose()
        reader.dispose()


def test_a_server_url_loses_its_password_and_query() -> None:
    url = make_url("postgresql+psycopg://ann:s3cret@db.example:5432/ledger?password=x&sslmode=y")
    assert database_label(url) == "postgresql+psycopg://ann@db.example:5432/ledger"
    socket = make_url("postgresql+psycopg:///ledger?host=/run/postgresql&password=x")
    assert database_label(socket) == "postgresql+psycopg:///ledger"


def test_the_errors_say_where_and_survive_pickling() -> None:
    episode = EpisodeNotFound("weekly", "2026-W32-7", "/p/.episodic/episodic.db")
    assert str(episode) == (
        "episode 2026-W32-7 not found in pipeline 'weekly' (database: /p/.episodic/episodic.db)"
    )
    run = RunNotFound("0d45478b", "postgresql+psycopg://ann@h:5432/ledger")
    assert str(run) == "run 0d45478b not found (database: postgresql+psycopg://ann@h:5432/ledger)"
    for error in (episode, run, EpisodeNotFound("weekly", "2026-W32-7"), RunNotFound("r")):
        copy = pickle.loads(pickle.dumps(error))  # a Prefect task's failure crosses processes
        assert type(copy) is type(error) and str(copy) == str(error)
    assert str(RunNotFound("r")) == "run r not found"
