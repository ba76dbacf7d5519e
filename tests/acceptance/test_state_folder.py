"""State anchored to the project: every command uses the project's state folder wherever it
starts, "not found" names the database it looked in, and `episodic state remove` refuses to
forget what was paid for unless told twice."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from tests.generation import write_playlist
from tests.project_copy import ProjectCopy, make_project_copy, make_site_install, run_env

Cli = Callable[..., subprocess.CompletedProcess[str]]
pytestmark = pytest.mark.e2e
SQLITE_ONLY = pytest.mark.parametrize("backend", ["sqlite"])
POSTGRES_ONLY = pytest.mark.parametrize(
    "backend", [pytest.param("postgres", marks=pytest.mark.postgres)]
)


def _label(url: str) -> str:
    """The database as messages name it: a SQLite file's path, else the URL without a
    password (written out here, not computed by the code under test)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        assert parsed.database is not None
        return parsed.database
    user = f"{parsed.username}@" if parsed.username else ""
    return f"{parsed.drivername}://{user}{parsed.host}:{parsed.port}/{parsed.database}"


def test_not_found_names_the_database_it_looked_in(cli: Cli, database_url: str) -> None:
    where = f"(database: {_label(database_url)})"
    shown = cli("episodes", "show", "2026-W32-7")
    assert shown.returncode == 5
    assert shown.stderr.splitlines() == [
        f"error: episode 2026-W32-7 not found in pipeline 'weekly' {where}"
    ]
    checked = cli("check", "2026-W32-7")
    assert checked.returncode == 5 and checked.stderr.splitlines() == shown.stderr.splitlines()
    run_id = "0d45478b-098c-4a4a-9a52-0d9ecb6a88ed"
    for command in (["runs", "show", run_id], ["runs", "resume", run_id]):
        result = cli(*command)
        assert result.returncode == 5, command
        assert result.stderr.splitlines() == [f"error: run {run_id} not found {where}"]
    assert cli("episodes", "list").stdout.strip() == f"no episodes in pipeline 'weekly' {where}"
    assert "password" not in shown.stderr and ":@" not in shown.stderr


def test_a_reader_names_the_ledger_file_it_did_not_find(cli: Cli, tmp_path: Path) -> None:
    """`check` only reads: on a state folder without a ledger it says which file it looked
    for (exit 1, as any database it cannot open) and creates nothing."""
    home = tmp_path / "home"
    result = cli("check", "--all")
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"error: no database at {home / 'episodic.db'}: the SQLite file does not exist"
    ]
    assert not home.exists()


@POSTGRES_ONLY
def test_a_password_never_reaches_the_message(cli: Cli, database_url: str) -> None:
    parsed = make_url(database_url)
    with_password = parsed.set(password="s3cret-pw").render_as_string(hide_password=False)
    result = cli("episodes", "show", "2026-W32-7", env={"EPISODIC_DATABASE_URL": with_password})
    assert result.returncode == 5
    assert "s3cret-pw" not in result.stderr and f"(database: {_label(database_url)})" in (
        result.stderr
    )


@pytest.fixture
def project(tmp_path: Path) -> ProjectCopy:
    return make_project_copy(tmp_path / "checkout")


def _in(copy: ProjectCopy, cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The copy's installed `episodic`, started in ``cwd`` with no EPISODIC_* variable."""
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        [str(copy.episodic), *args],
        cwd=cwd,
        env=run_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_every_folder_uses_the_projects_state(project: ProjectCopy, tmp_path: Path) -> None:
    cron_cwd, other_cwd = tmp_path / "cron-home", tmp_path / "elsewhere"
    made = _in(project, cron_cwd, "allocate", "--key", "k", "--week", "2026-W32")
    assert made.returncode == 0 and made.stdout.strip() == "2026-W32-0 (new)", made.stderr
    state = project.folder / ".episodic"
    assert (state / "episodic.db").is_file()
    listed = _in(project, other_cwd, "episodes", "list", "--json")
    assert [e["episode_id"] for e in json.loads(listed.stdout)] == ["2026-W32-0"]
    again = _in(project, other_cwd, "allocate", "--key", "k", "--week", "2026-W32")
    assert again.stdout.strip() == "2026-W32-0 (existing)"
    for cwd in (cron_cwd, other_cwd):
        assert list(cwd.iterdir()) == [], cwd  # nothing created where the command started
    missing = _in(project, other_cwd, "episodes", "show", "2026-W32-5")
    assert missing.returncode == 5 and f"(database: {state / 'episodic.db'})" in missing.stderr
    shown = json.loads(_in(project, other_cwd, "state", "show", "--json").stdout)
    assert shown["home"] == str(state) and shown["project"] == str(project.folder)


def test_a_relative_home_is_relative_to_the_project(project: ProjectCopy, tmp_path: Path) -> None:
    cwd = tmp_path / "elsewhere"
    made = _in(
        project, cwd, "allocate", "--key", "k", "--week", "2026-W32", EPISODIC_HOME="state/a"
    )
    assert made.returncode == 0, made.stderr
    assert (project.folder / "state" / "a" / "episodic.db").is_file()
    assert list(cwd.iterdir()) == []


def test_prefect_home_follows_the_state_folder(project: ProjectCopy, tmp_path: Path) -> None:
    """The Prefect defaults our commands set (`tasks._prefect_env`) land in the same folder."""
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    probe = "import os, episodic.tasks; print(os.environ['PREFECT_HOME'])"
    result = subprocess.run(
        [str(project.python), "-c", probe],
        cwd=cwd,
        env=run_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(project.folder / ".episodic" / "prefect")
    assert (project.folder / ".episodic" / "prefect").is_dir() and list(cwd.iterdir()) == []


def test_an_install_without_a_checkout_uses_the_users_data_folder(tmp_path: Path) -> None:
    """`pip install .` into a virtualenv: no project folder, so never site-packages nor the
    working directory, but the user's data folder (XDG)."""
    installed = make_site_install(tmp_path / "venv-owner")
    user = tmp_path / "user"
    cwd = tmp_path / "elsewhere"
    unset_xdg = {"HOME": str(user), "XDG_DATA_HOME": ""}  # the default: ~/.local/share
    made = _in(installed, cwd, "allocate", "--key", "k", "--week", "2026-W32", **unset_xdg)
    assert made.returncode == 0, made.stderr
    state = user / ".local" / "share" / "episodic"
    assert (state / "episodic.db").is_file() and list(cwd.iterdir()) == []
    shown = json.loads(_in(installed, cwd, "state", "show", "--json", **unset_xdg).stdout)
    assert shown["project"] is None and shown["home"] == str(state)
    xdg = _in(
        installed,
        cwd,
        "state",
        "show",
        "--json",
        HOME=str(user),
        XDG_DATA_HOME=str(tmp_path / "xdg"),
    )
    assert json.loads(xdg.stdout)["home"] == str(tmp_path / "xdg" / "episodic")


# -- episodic state remove --------------------------------------------------------------------


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"  # the test's EPISODIC_HOME (tests/conftest.py)


def _paid(cli: Cli, tmp_path: Path) -> None:
    """Three fake-provider images bought (3 paid calls, 0.12 USD)."""
    assert cli("allocate", "--key", "k", "--week", "2026-W32").returncode == 0
    playlist = write_playlist(tmp_path / "pl", ["a", "b", "c"])
    assert cli("plan", "2026-W32-0", "--playlist", str(playlist)).returncode == 0
    generated = cli("generate", "2026-W32-0", "--json")
    assert generated.returncode == 0, generated.stderr
    assert json.loads(generated.stdout)["cost_micros"] == 120_000


@SQLITE_ONLY
def test_remove_refuses_while_the_ledger_holds_paid_calls(
    cli: Cli, database_url: str, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))
    _paid(cli, tmp_path)
    before = sorted(p.relative_to(home) for p in home.rglob("*") if p.is_file())
    expected = (
        f"error: the ledger {home / 'episodic.db'} holds 3 paid calls (0.12 USD): removing "
        f"{home} forgets what was paid for (a later run pays again); pass both --yes and "
        "--including-paid to remove it anyway"
    )
    for flags in ([], ["--yes"], ["--including-paid"]):
        refused = cli("state", "remove", *flags)
        assert refused.returncode == 2, flags
        assert refused.stderr.splitlines() == [expected], flags
    after = {p.relative_to(home) for p in home.rglob("*") if p.is_file()}
    assert after >= set(before)  # nothing removed (reading a WAL database adds its -shm file)
    assert "3 paid calls (0.12 USD)" in cli("state", "show").stdout
    removed = cli("state", "remove", "--yes", "--including-paid")
    assert removed.returncode == 0, removed.stderr
    assert removed.stdout.strip() == f"removed {home} (its ledger held 3 paid calls (0.12 USD))"
    assert not home.exists()
    nothing = cli("state", "remove", "--yes")
    assert (nothing.returncode, nothing.stdout.strip()) == (
        0,
        f"nothing to remove: {home} does not exist",
    )
    assert not home.exists()  # `state show` and `state remove` create nothing


@SQLITE_ONLY
def test_remove_without_paid_calls_needs_yes(cli: Cli, database_url: str, home: Path) -> None:
    assert cli("allocate", "--key", "k", "--week", "2026-W32").returncode == 0  # no paid call
    refused = cli("state", "remove")
    assert refused.returncode == 2 and refused.stderr.splitlines() == [
        f"error: this removes {home} (its ledger holds no paid call): pass --yes"
    ]
    assert (home / "episodic.db").is_file()
    removed = cli("state", "remove", "--yes", "--json")
    assert removed.returncode == 0 and json.loads(removed.stdout)["removed"] is True
    assert not home.exists()


@POSTGRES_ONLY
def test_remove_never_drops_a_server_database(cli: Cli, database_url: str, home: Path) -> None:
    assert cli("allocate", "--key", "k", "--week", "2026-W32").returncode == 0
    home.mkdir(parents=True, exist_ok=True)
    (home / "kept.txt").write_text("an image the shared ledger records")
    refused = cli("state", "remove", "--yes", "--including-paid")
    assert refused.returncode == 2
    assert refused.stderr.splitlines() == [
        f"error: the ledger is the server database {_label(database_url)}: `episodic state "
        f"remove` never drops a server database, nor removes {home}, whose images it records "
        "as paid"
    ]
    assert (home / "kept.txt").is_file()
    listed = json.loads(cli("episodes", "list", "--json").stdout)
    assert [e["episode_id"] for e in listed] == ["2026-W32-0"]


def test_remove_refuses_a_ledger_outside_the_state_folder(
    cli: Cli, home: Path, tmp_path: Path
) -> None:
    ledger = tmp_path / "elsewhere" / "ledger.db"
    env = {"EPISODIC_DATABASE_URL": f"sqlite:///{ledger}"}
    assert cli("allocate", "--key", "k", "--week", "2026-W32", env=env).returncode == 0
    home.mkdir(parents=True, exist_ok=True)
    refused = cli("state", "remove", "--yes", "--including-paid", env=env)
    assert refused.returncode == 2 and "outside the state folder" in refused.stderr
    assert ledger.is_file() and home.is_dir()


def test_remove_refuses_a_folder_holding_the_project(cli: Cli, tmp_path: Path) -> None:
    project = _fake_project(tmp_path / "checkout")
    env = {"EPISODIC_HOME": str(tmp_path), "EPISODIC_PROJECT_DIR": str(project)}
    refused = cli("state", "remove", "--yes", "--including-paid", env=env)
    assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1
    assert "holds the project folder or your home folder" in refused.stderr
    assert project.is_dir()


# -- EPISODIC_PROJECT_DIR and EPISODIC_HOME values, `state remove` of what is not state ------


def _fake_project(folder: Path) -> Path:
    """A folder `episodic.core.home` recognises as an episodic project (its pyproject.toml)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pyproject.toml").write_text('[project]\nname = "episodic"\n')
    return folder


def _at(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The installed `episodic`, started in ``cwd`` with the test's environment plus ``env``."""
    from tests.acceptance.conftest import EPISODIC

    assert EPISODIC is not None
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        [EPISODIC, *args],
        cwd=cwd,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def _refused(result: subprocess.CompletedProcess[str], text: str) -> None:
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and text in lines[0], lines
    assert not any(ord(c) < 32 for c in lines[0])


@pytest.mark.parametrize("value", [".", "relative", "/nonexistent", "TMP", "/", " ", "CTRL"])
def test_a_project_dir_that_is_not_an_absolute_project_folder_is_refused(
    value: str, tmp_path: Path
) -> None:
    """A relative EPISODIC_PROJECT_DIR would follow the shell again (a cron job's empty
    ledger pays twice); a folder that is not a project has no state of this project."""
    cwd = tmp_path / "cronhome"
    value = {"TMP": str(tmp_path), "CTRL": f"{tmp_path}/a\x07b"}.get(value, value)
    for command in (["state", "show"], ["allocate", "--key", "cron:w10", "--week", "2027-W10"]):
        _refused(
            _at(cwd, *command, EPISODIC_PROJECT_DIR=value, EPISODIC_HOME=".episodic"),
            "EPISODIC_PROJECT_DIR",
        )
    assert list(cwd.iterdir()) == [] and not (tmp_path / ".episodic").exists()


def test_a_project_dir_naming_a_project_folder_anchors_the_state(tmp_path: Path) -> None:
    project = _fake_project(tmp_path / "mount")
    shown = _at(
        tmp_path / "cwd",
        "state",
        "show",
        "--json",
        EPISODIC_PROJECT_DIR=str(project),
        EPISODIC_HOME="state",
    )
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["home"] == str(project / "state")


@pytest.mark.parametrize("value", [" ", "\t", "state/a\x01b"])
def test_a_blank_home_or_one_with_control_characters_is_refused(value: str, tmp_path: Path) -> None:
    project = _fake_project(tmp_path / "checkout")
    before = sorted(project.iterdir())
    result = _at(
        tmp_path / "cwd",
        "allocate",
        "--key",
        "k",
        "--week",
        "2026-W32",
        EPISODIC_PROJECT_DIR=str(project),
        EPISODIC_HOME=value,
    )
    _refused(result, "EPISODIC_HOME")
    assert sorted(project.iterdir()) == before


def test_remove_refuses_a_folder_that_is_not_a_state_folder(cli: Cli, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "thesis.txt").write_text("a user's file")
    refused = cli("state", "remove", "--yes", env={"EPISODIC_HOME": str(victim)})
    _refused(refused, "is not a state folder")
    assert (victim / "thesis.txt").is_file()


def test_remove_refuses_a_folder_of_the_project(tmp_path: Path) -> None:
    project = _fake_project(tmp_path / "checkout")
    (project / "core").mkdir()
    (project / "core" / "home.py").write_text("# the package")
    env = {"EPISODIC_PROJECT_DIR": str(project), "EPISODIC_HOME": "core"}
    _refused(_at(tmp_path / "cwd", "state", "remove", "--yes", **env), str(project / "core"))
    assert (project / "core" / "home.py").is_file()
    (project / "core" / "episodic.db").write_bytes(b"")  # even one holding a ledger file
    _refused(_at(tmp_path / "cwd", "state", "remove", "--yes", **env), "home.py")
    assert (project / "core" / "home.py").is_file()


@SQLITE_ONLY
def test_remove_takes_an_unmarked_folder_holding_a_ledger(
    cli: Cli, database_url: str, home: Path
) -> None:
    """A state folder from before the marker: its ledger says what it is."""
    assert cli("allocate", "--key", "k", "--week", "2026-W32").returncode == 0
    assert not (home / ".episodic-state").exists()  # the fixture made the folder, not episodic
    (home / "notes.txt").write_text("not the project's")
    _refused(cli("state", "remove", "--yes"), "notes.txt")
    assert (home / "episodic.db").is_file() and (home / "notes.txt").is_file()
    (home / "notes.txt").unlink()
    removed = cli("state", "remove", "--yes")
    assert removed.returncode == 0, removed.stderr
    assert not home.exists()


def test_a_state_folder_the_project_creates_is_marked(cli: Cli, home: Path) -> None:
    assert cli("allocate", "--key", "k", "--week", "2026-W32").returncode == 0
    assert (home / ".episodic-state").is_file()
    (home / "episodic.db").unlink()  # the marker alone says what it is
    (home / "report.pdf").write_bytes(b"%PDF")
    _refused(cli("state", "remove", "--yes"), "report.pdf")
    assert (home / "report.pdf").is_file()
    (home / "report.pdf").unlink()
    assert cli("state", "remove", "--yes").returncode == 0 and not home.exists()


@pytest.mark.parametrize("url", ["sqlite:///ledger.db", "sqlite:///./state/ledger.db"])
def test_a_relative_sqlite_ledger_is_refused(url: str, tmp_path: Path) -> None:
    """A relative SQLite path follows the working directory: an empty ledger there would
    pay again for what the real one records."""
    cwd = tmp_path / "cronhome"
    made = _at(cwd, "allocate", "--key", "k", "--week", "2026-W32", EPISODIC_DATABASE_URL=url)
    _refused(made, "EPISODIC_DATABASE_URL")
    assert list(cwd.iterdir()) == []
