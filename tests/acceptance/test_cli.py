"""The installed `episodic` command, as a user runs it, on SQLite and Postgres."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest

from episodic.storage.schema import HEAD_REVISION

Cli = Callable[..., subprocess.CompletedProcess[str]]

pytestmark = pytest.mark.e2e


def test_allocate_prints_json_and_is_retry_safe(cli: Cli, database_url: str) -> None:
    first = cli("allocate", "--key", "manual:1", "--week", "2026-W32", "--json")
    assert first.returncode == 0, first.stderr
    payload = json.loads(first.stdout)
    assert {
        k: payload[k]
        for k in ("episode_id", "week_id", "sequence", "allocation_key", "pipeline", "created")
    } == {
        "episode_id": "2026-W32-0",
        "week_id": "2026-W32",
        "sequence": 0,
        "allocation_key": "manual:1",
        "pipeline": "weekly",
        "created": True,
    }
    second = cli("allocate", "--key", "manual:2", "--at", "2026-08-07T09:00:00+02:00")
    assert second.returncode == 0 and second.stdout.strip() == "2026-W32-1 (new)"
    retry = cli("allocate", "--key", "manual:1", "--week", "2026-W32")
    assert retry.stdout.strip() == "2026-W32-0 (existing)"


def test_a_key_tied_to_another_week_exits_3_and_changes_nothing(
    cli: Cli, database_url: str
) -> None:
    assert cli("allocate", "--key", "k", "--week", "2026-W32").returncode == 0
    before = cli("episodes", "list", "--json").stdout
    moved = cli("allocate", "--key", "k", "--week", "2026-W33", "--json")
    assert moved.returncode == 3
    assert "2026-W32-0" in moved.stderr and "Traceback" not in moved.stderr
    assert cli("episodes", "list", "--json").stdout == before


@pytest.mark.parametrize(
    "args",
    [
        ["allocate", "--key", "k"],
        ["allocate", "--key", "k", "--week", "2026-W32", "--at", "2026-08-07T09:00:00Z"],
        ["allocate", "--key", "k", "--week", "2027-W53"],
        ["allocate", "--key", "k", "--week", "banana"],
        ["allocate", "--key", "k", "--at", "2026-08-07T09:00:00"],
        ["allocate", "--key", "", "--week", "2026-W32"],
        ["allocate", "--key", "k", "--week", "2026-W32", "--pipeline", "No Spaces"],
        ["allocate", "--week", "2026-W32"],
        ["episodes", "show", "../../etc/passwd"],
        ["episodes", "list", "--week", "2026-W99"],
        ["no-such-command"],
    ],
)
def test_bad_input_exits_2_with_a_reason_and_no_traceback(
    cli: Cli, database_url: str, args: list[str]
) -> None:
    result = cli(*args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stderr.strip()
    assert "Traceback" not in result.stderr + result.stdout
    assert cli("episodes", "list", "--json").stdout.strip() == "[]"


def test_bad_environment_exits_2(cli: Cli, database_url: str) -> None:
    result = cli("episodes", "list", env={"EPISODIC_TIMEZONE": "Mars/Base"})
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: EPISODIC_TIMEZONE: unknown timezone 'Mars/Base' (expected an IANA name such as "
        "Europe/Berlin)"
    ]


def test_episodes_list_and_show(cli: Cli, database_url: str) -> None:
    for key, week in (("a", "2026-W32"), ("b", "2026-W32"), ("c", "2026-W33")):
        assert cli("allocate", "--key", key, "--week", week).returncode == 0
    listed = json.loads(cli("episodes", "list", "--json").stdout)
    assert [e["episode_id"] for e in listed] == ["2026-W32-0", "2026-W32-1", "2026-W33-0"]
    week = json.loads(cli("episodes", "list", "--week", "2026-W33", "--json").stdout)
    assert [e["allocation_key"] for e in week] == ["c"]
    human = cli("episodes", "list")
    assert human.returncode == 0 and "2026-W32-1" in human.stdout

    shown = json.loads(cli("episodes", "show", "2026-W32-1", "--json").stdout)
    assert shown["allocation_key"] == "b"
    assert [event["kind"] for event in shown["history"]] == ["allocated"]
    assert "2026-W32-1" in cli("episodes", "show", "2026-W32-1").stdout


def test_show_missing_episode_exits_5(cli: Cli, database_url: str) -> None:
    result = cli("episodes", "show", "2026-W32-7")
    assert result.returncode == 5
    assert result.stderr.strip().startswith(
        "error: episode 2026-W32-7 not found in pipeline 'weekly' (database: "
    )  # which database: tests/acceptance/test_state_folder.py


def test_pipelines_are_separate(cli: Cli, database_url: str) -> None:
    assert cli("allocate", "--key", "k", "--week", "2026-W32").returncode == 0
    other = cli("allocate", "--key", "k", "--week", "2026-W32", "--pipeline", "podcast", "--json")
    assert json.loads(other.stdout)["sequence"] == 0
    via_env = cli("episodes", "list", "--json", env={"EPISODIC_PIPELINE": "podcast"})
    assert [e["pipeline"] for e in json.loads(via_env.stdout)] == ["podcast"]


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_prints_the_installed_package_version(cli: Cli, flag: str) -> None:
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    result = cli(flag)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"episodic {pyproject['project']['version']}\n"
    assert result.stderr == ""


@pytest.mark.parametrize(
    "command",
    [
        [],
        ["allocate"],
        ["episodes"],
        ["episodes", "list"],
        ["episodes", "show"],
        ["db"],
        ["db", "upgrade"],
        ["db", "current"],
        ["db", "installation"],
        ["plan"],
        ["generate"],
        ["retry"],
        ["runs", "list"],
        ["runs", "show"],
        ["runs", "resume"],
        ["runs", "cancel"],
        ["approve"],
        ["assemble"],
        ["check"],
        ["migrate-legacy"],
        ["demo"],
        ["serve"],
        ["pipelines", "list"],
        ["pipelines", "set-timezone"],
        ["prefect", "setup"],
        ["dispatch"],
        ["replay"],
        ["sweep"],
        ["spend"],
    ],
)
def test_every_command_has_help(cli: Cli, command: list[str]) -> None:
    result = cli(*command, "--help")
    assert result.returncode == 0
    assert "Usage: episodic" in result.stdout


def test_db_upgrade_on_an_empty_database(
    cli: Cli,
    backend: str,
    request: pytest.FixtureRequest,
    tmp_path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'fresh.db'}"
    else:
        databases = request.getfixturevalue("postgres_databases")
        name = databases.fresh(migrated=False)
        request.addfinalizer(lambda: databases.drop(name))
        url = databases.url(name)
    env = {"EPISODIC_DATABASE_URL": url}
    if backend == "postgres":
        refused = cli("episodes", "list", env=env)
        assert refused.returncode == 1
        assert "episodic db upgrade" in refused.stderr
    first = cli("db", "upgrade", "--json", env=env)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["to"] == HEAD_REVISION
    installation = json.loads(first.stdout)["installation"]
    assert re.fullmatch(r"[0-9a-f]{16}", installation)
    again = json.loads(cli("db", "upgrade", "--json", env=env).stdout)
    assert again["changed"] is False and again["installation"] == installation
    assert cli("episodes", "list", "--json", env=env).stdout.strip() == "[]"
    # the installation id, shown where the schema is (docs/providers.md)
    current = json.loads(cli("db", "current", "--json", env=env).stdout)
    assert current["installation"] == installation
    assert cli("db", "installation", env=env).stdout.strip() == installation
    renewed = json.loads(cli("db", "installation", "--renew", "--json", env=env).stdout)
    assert renewed["previous"] == installation and renewed["installation"] != installation
    shown = cli("db", "current", env=env).stdout
    assert (
        shown.strip()
        == f"{HEAD_REVISION} (head {HEAD_REVISION}), installation {renewed['installation']}"
    )


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["--version"],
        ["episodes", "list"],
        ["allocate", "--key", "k", "--week", "2026-W32"],
        ["spend", "--group-by", "profile", "--json"],
    ],
)
def test_commands_that_run_no_flow_never_import_prefect(database_url: str, args: list[str]) -> None:
    probe = (
        "import sys\n"
        "from episodic.cli.app import run\n"
        f"code = run({args!r})\n"
        "assert 'prefect' not in sys.modules, 'prefect was imported'\n"
        "sys.exit(code)\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_pipeline_timezone_is_recorded_once_and_a_disagreeing_process_refuses(
    cli: Cli, database_url: str
) -> None:
    """Monday 00:30 in Berlin is ISO week 46 whatever this process's zone; a
    process with another EPISODIC_TIMEZONE refuses (exit 2, one line) instead of W45."""
    berlin = {"EPISODIC_TIMEZONE": "Europe/Berlin"}
    first = cli("allocate", "--key", "k1", "--at", "2026-11-09T00:30:00+01:00", env=berlin)
    assert first.returncode == 0 and first.stdout.strip() == "2026-W46-0 (new)", first.stderr
    unset = cli("allocate", "--key", "k2", "--at", "2026-11-09T00:30:00+01:00")
    assert unset.stdout.strip() == "2026-W46-1 (new)", unset.stderr  # the record wins
    utc = cli(
        "allocate",
        "--key",
        "k3",
        "--at",
        "2026-11-09T00:30:00+01:00",
        env={"EPISODIC_TIMEZONE": "UTC"},
    )
    assert utc.returncode == 2 and utc.stdout == ""
    assert utc.stderr.count("\n") == 1 and "runs in Europe/Berlin" in utc.stderr
    listed = json.loads(cli("pipelines", "list", "--json").stdout)
    assert [(p["pipeline"], p["timezone"]) for p in listed] == [("weekly", "Europe/Berlin")]
    moved = cli("pipelines", "set-timezone", "weekly", "UTC")
    assert moved.returncode == 0 and "Europe/Berlin → UTC" in moved.stdout
    again = cli(
        "allocate",
        "--key",
        "k3",
        "--at",
        "2026-11-09T00:30:00+01:00",
        env={"EPISODIC_TIMEZONE": "UTC"},
    )
    assert again.stdout.strip() == "2026-W45-0 (new)"  # Sunday 23:30 UTC, now on purpose
    bad = cli("pipelines", "set-timezone", "weekly", "Mars/Base")
    assert bad.returncode == 2 and "unknown timezone" in bad.stderr


def test_episodes_show_gives_the_episodes_spend_as_the_provider_billed_it(
    cli: Cli, database_url: str, tmp_path: Path
) -> None:
    """`episodes show` (and --json) gives what the episode cost over every run, per
    currency: the fake provider's own bill (its job files), not a figure of one run."""
    from tests.generation import provider_log, write_playlist

    log = str(tmp_path / "provider.jsonl")
    fake = {"EPISODIC_FAKE_PROVIDER_LOG": log}
    assert cli("allocate", "--key", "k", "--week", "2026-W32").returncode == 0
    playlist = write_playlist(tmp_path / "pl", ["a", "b", "c"])
    assert cli("plan", "2026-W32-0", "--playlist", str(playlist)).returncode == 0
    assert cli("generate", "2026-W32-0", "--only", "v01", env=fake).returncode == 0
    assert cli("generate", "2026-W32-0", env=fake).returncode == 0  # a second run: two more
    jobs = [e for e in provider_log(log) if e["event"] == "job_created"]
    billed = sum(int(job["cost_micros"]) for job in jobs)
    assert len(jobs) == 3 and billed > 0

    shown = json.loads(cli("episodes", "show", "2026-W32-0", "--json").stdout)
    assert shown["paid_submissions"] == 3 and shown["costs"] == {"USD": billed}
    human = cli("episodes", "show", "2026-W32-0").stdout
    assert f"spend: {billed / 1_000_000:.2f} USD (3 paid calls, every run)" in human
    # The history reads as words, never a Python dict (its structure is in --json).
    assert "allocation key k" in human, human
    assert "{'" not in human and "'run_id'" not in human, human
