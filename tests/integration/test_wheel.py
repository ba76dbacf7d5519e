"""The distribution a team installs: one import package, `episodic`, with what the product needs
at run time, and nothing that runs only from a checkout. Built here with the project's own uv
(`make bootstrap` puts it in .tools), installed into a fresh virtualenv with the locked
dependencies, and used from a scratch team repository that has its own `flows` and `tasks`
packages, the usual layout of a Prefect project."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import pytest

from tests.installed import build_wheel, clean_env, install_wheel, run, team_repository, uv

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv holding the locked dependencies and the built wheel."""
    return install_wheel(wheel, tmp_path_factory.mktemp("venv"))


def test_the_wheel_holds_one_import_package_and_its_run_time_data(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"episodic"}
    subpackages = {name.split("/")[1] for name in names if name.startswith("episodic/")}
    assert {"core", "storage", "providers", "pipeline", "tasks", "flows"} <= subpackages
    assert {"deployments", "cli", "examples", "__init__.py"} <= subpackages
    assert not subpackages & {"tests", "bench", "reliability"}
    assert "episodic/__main__.py" in names  # python -m episodic
    assert "episodic/examples/playlist.yaml" in names
    assert "episodic/examples/reference/style.txt" in names  # the playlist's reference file
    assert "episodic/storage/migrations/script.py.mako" in names
    assert any(n.startswith("episodic/storage/migrations/versions/") for n in names)
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "episodic = episodic.cli.entry:main" in text


def test_a_team_repository_with_its_own_flows_imports_both(venv: Path, tmp_path: Path) -> None:
    team = team_repository(tmp_path)
    code = (
        "import json, flows, flows.weekly, tasks\n"
        "import episodic.flows.weekly, episodic.tasks, episodic.cli.app\n"
        "from episodic.core.resources import example_playlist\n"
        "print(json.dumps({'flows': flows.OWNER, 'weekly': flows.weekly.weekly(),\n"
        "  'tasks': tasks.OWNER, 'ours': episodic.flows.weekly.__file__,\n"
        "  'playlist': str(example_playlist())}))\n"
    )
    done = run(
        [str(venv / "bin" / "python"), "-c", code],
        team,
        clean_env(EPISODIC_HOME=str(tmp_path / "home")),
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["flows"] == "team flows" and seen["tasks"] == "team tasks"
    assert seen["weekly"] == "theirs"
    assert Path(seen["ours"]).is_relative_to(venv)  # the installed copy, not this checkout
    assert Path(seen["playlist"]).is_relative_to(venv) and Path(seen["playlist"]).is_file()
    installed = {p.name for p in next((venv / "lib").glob("python3*/site-packages")).iterdir()}
    assert not installed & {"core", "storage", "providers", "pipeline", "cli", "bench"}


def test_the_demo_runs_from_the_installed_wheel_outside_any_clone(
    venv: Path, tmp_path: Path
) -> None:
    team = team_repository(tmp_path)
    home = tmp_path / "home"
    demo = [str(venv / "bin" / "episodic"), "demo", "--week", "2026-W40", "--json"]
    done = run(demo, team, clean_env(EPISODIC_HOME=str(home)), timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    checked = run(
        [str(venv / "bin" / "episodic"), "check", "--all", "--json"],
        team,
        clean_env(EPISODIC_HOME=str(home)),
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert json.loads(done.stdout), done.stdout
    assert "2026-W40-0" in done.stdout and "2026-W40-1" in done.stdout, done.stdout
    assert (home / "episodic.db").is_file()


def test_init_in_a_team_repository_writes_its_prefect_yaml_and_makes_it_the_project(
    venv: Path, tmp_path: Path
) -> None:
    """`episodic init` from the installed wheel, in a team's repository: the playlist and a
    `prefect.yaml` of episodic's deployments (module entrypoints, the weekly playlist named
    relative to the repository) are written there. With EPISODIC_PROJECT_DIR naming the
    repository (what a worker sets), it is the project folder: its state folder is the
    repository's, and a folder with no such prefect.yaml is refused in one line."""
    import yaml

    team = team_repository(tmp_path)
    episodic = str(venv / "bin" / "episodic")
    env = clean_env(EPISODIC_HOME=str(tmp_path / "home"))
    done = run([episodic, "init"], team, env)
    assert done.returncode == 0, done.stderr
    assert f"prefect: wrote {team / 'prefect.yaml'}" in done.stdout, done.stdout
    assert "`prefect deploy --all`" in done.stdout and (team / "playlist.yaml").is_file()
    written = yaml.safe_load((team / "prefect.yaml").read_text())
    (weekly,) = [d for d in written["deployments"] if d["name"] == "weekly"]
    assert weekly["parameters"]["playlist"] == "playlist.yaml"
    # The repository keeps its providers file, says how every command reads it, and ignores
    # the state folder (the ledger, paid images) in git and in an image's build context.
    assert (team / "providers.yaml").is_file(), done.stdout
    assert f"EPISODIC_PROVIDERS_FILE={team / 'providers.yaml'}" in done.stdout, done.stdout
    for ignore in (".gitignore", ".dockerignore"):
        assert ".episodic/" in (team / ignore).read_text().splitlines(), ignore
    again = run([episodic, "init"], team, env)
    assert again.returncode == 0 and "wrote" not in again.stdout, again.stdout
    assert (team / ".gitignore").read_text().count(".episodic/") == 1
    other = tmp_path / "other"
    other.mkdir()
    (other / ".gitignore").write_text("node_modules")  # theirs, no newline at its end
    outside = run([episodic, "init", "--playlist", "sub/../../outside.yaml"], other, env)
    assert outside.returncode == 0, outside.stderr
    assert (other / ".gitignore").read_text().splitlines()[0] == "node_modules"
    assert "added .episodic/" in outside.stdout, outside.stdout
    elsewhere = yaml.safe_load((other / "prefect.yaml").read_text())
    (outside_weekly,) = [d for d in elsewhere["deployments"] if d["name"] == "weekly"]
    assert outside_weekly["parameters"]["playlist"] == str(tmp_path / "outside.yaml")  # not ../
    newline = run([episodic, "init", "--playlist", "a\nb.yaml"], tmp_path / "other", env)
    assert newline.returncode == 2 and len(newline.stderr.strip().splitlines()) == 1
    as_module = run([str(venv / "bin" / "python"), "-m", "episodic", "--version"], tmp_path, env)
    assert as_module.returncode == 0 and as_module.stdout.startswith("episodic"), as_module
    assert weekly["entrypoint"] == "episodic.flows.weekly:weekly_episode"
    as_project = clean_env(EPISODIC_PROJECT_DIR=str(team))
    shown = run([episodic, "state", "show", "--json"], tmp_path, as_project)
    assert shown.returncode == 0, shown.stderr
    state = json.loads(shown.stdout)
    assert state["project"] == str(team) and state["home"] == str(team / ".episodic")
    refused = run(
        [episodic, "state", "show"], tmp_path, clean_env(EPISODIC_PROJECT_DIR=str(tmp_path))
    )
    assert refused.returncode == 2 and "is not an episodic project folder" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr


_TEAM_TEST = """
import sys
from pathlib import Path

PLAYLIST = Path(__file__).parent.parent / "playlists" / "weekly.yaml"


def test_nothing_is_imported_for_a_test_that_asks_for_no_fixture():
    assert "prefect" not in sys.modules and "episodic.testing.sandbox" not in sys.modules


def test_my_week_buys_each_image_once(episodic_sandbox):
    week = episodic_sandbox.plan(PLAYLIST, week="2026-W32")
    week.generate(max_cost="0.60")
    assert set(week.jobs_per_item().values()) == {1} and len(week.jobs_per_item()) == week.images


def test_a_wrong_expectation(episodic_sandbox):
    week = episodic_sandbox.plan(PLAYLIST, week="2026-W33")
    week.generate(max_cost="0.60")
    assert set(week.jobs_per_item().values()) == {2}  # deliberately wrong: each was bought once
"""


def test_a_team_tests_its_own_week_with_the_installed_plugin(venv: Path, tmp_path: Path) -> None:
    """The wheel's pytest plugin in a fresh virtualenv (the wheel, its locked dependencies and
    pytest: nothing of this checkout): a team's test of its week passes, a deliberately
    wrong expectation fails, and a test that asks for no fixture imports none of it."""
    from importlib.metadata import version

    from episodic.core.resources import example_playlist

    pins = [f"{name}=={version(name)}" for name in ("pytest", "pluggy", "iniconfig")]
    installed = run(
        [uv(), "pip", "install", "--quiet", *pins],
        tmp_path,
        {**clean_env(), "VIRTUAL_ENV": str(venv)},
        timeout=600,
    )
    assert installed.returncode == 0, installed.stderr
    team = team_repository(tmp_path)
    playlists = team / "playlists"
    shutil.copytree(example_playlist().parent / "reference", playlists / "reference")
    shutil.copyfile(example_playlist(), playlists / "weekly.yaml")
    (team / "tests").mkdir()
    (team / "tests" / "test_week.py").write_text(_TEAM_TEST)
    done = run(
        [str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        team,
        clean_env(),
        timeout=600,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 1, out  # pytest: some test failed
    assert "2 passed" in out and "1 failed" in out, out
    assert "FAILED tests/test_week.py::test_a_wrong_expectation" in out, out
    assert "{1} == {2}" in out, out  # the provider made one job per item, not two
