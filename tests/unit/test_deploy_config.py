"""`prefect.yaml` and `episodic serve` register the same deployments (`episodic.deployments.spec`),
and nothing in the YAML depends on the machine that deploys it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from episodic.deployments.spec import SWEEP_EVERY_S, SWEEP_SLUG, WEEKLY_SLOTS, deployment_specs

PROJECT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def config() -> dict:  # type: ignore[type-arg]
    return yaml.safe_load((PROJECT / "prefect.yaml").read_text())


def test_prefect_yaml_matches_the_spec(config: dict) -> None:  # type: ignore[type-arg]
    specs = {spec.name: spec for spec in deployment_specs()}
    entries = {entry["name"]: entry for entry in config["deployments"]}
    assert set(entries) == set(specs)
    for name, spec in specs.items():
        entry = entries[name]
        assert entry["entrypoint"] == spec.entrypoint
        assert " ".join(entry["description"].split()) == spec.description
        assert entry.get("parameters", {}) == spec.parameters
        assert entry["work_pool"]["name"] == "episodic"
        assert entry["version"] == "{{ episodic.version }}"
        expected_tags = spec.tags("weekly") if spec.schedule != "sweep" else ["episodic"]
        assert entry["tags"] == expected_tags
    weekly = entries["weekly"]["schedules"]
    assert [(s["slug"], s["cron"]) for s in weekly] == list(WEEKLY_SLOTS)
    assert {s["timezone"] for s in weekly} == {"{{ episodic.timezone }}"}  # from the database
    (sweep,) = entries["sweep"]["schedules"]
    assert (sweep["slug"], sweep["interval"]) == (SWEEP_SLUG, SWEEP_EVERY_S)


def test_every_entrypoint_is_a_module_path_to_the_named_flow() -> None:
    from prefect.flows import load_flow_from_entrypoint

    for spec in deployment_specs():
        assert re.fullmatch(r"[a-z_.]+:[a-z_]+", spec.entrypoint), spec.entrypoint
        assert load_flow_from_entrypoint(spec.entrypoint).name == spec.flow_name


def test_nothing_of_the_deploying_machine_is_in_the_yaml(config: dict) -> None:  # type: ignore[type-arg]
    text = (PROJECT / "prefect.yaml").read_text()
    assert "$EPISODIC_PROJECT_DIR" not in text and str(PROJECT) not in text
    assert config["pull"] == [{"episodic.deployments.steps.project_directory": {}}]
    (build,) = config["build"]
    assert build["episodic.deployments.steps.setup"]["id"] == "episodic"


def test_the_pull_step_moves_into_the_project_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from episodic.deployments.steps import project_directory

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("EPISODIC_PROJECT_DIR", raising=False)
    assert project_directory() == {"directory": str(PROJECT)}
    assert Path.cwd() == PROJECT
    monkeypatch.setenv("EPISODIC_PROJECT_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="EPISODIC_PROJECT_DIR"):
        project_directory()
    (tmp_path / "flows").mkdir()  # a folder of flows is not a project (site-packages has one)
    with pytest.raises(FileNotFoundError, match="not an episodic project folder"):
        project_directory()
    step = "episodic.deployments.steps.project_directory: {}"
    (tmp_path / "prefect.yaml").write_text(f"pull:\n  # - {step}\n")  # commented out
    with pytest.raises(FileNotFoundError, match="not an episodic project folder"):
        project_directory()
    lookalikes = [  # the step's text where Prefect would not run it as the pull step
        f"description: |\n  - {step}\n",
        "pull:\n  - episodic.deployments.steps.project_directory_other: {}\n",
        f"pull:\n  - {step}\n: : not yaml [\n",
        f"build:\n  - {step}\n",
        "pull:\n  - episodic.deployments.steps.project_directory:\n",  # no inputs: Prefect fails
    ]
    for text in lookalikes:
        (tmp_path / "prefect.yaml").write_text(text)
        with pytest.raises(FileNotFoundError, match="not an episodic project folder"):
            project_directory()
    (tmp_path / "prefect.yaml").write_text(f"pull:\n  - {step}\n")  # a team's repository
    assert project_directory() == {"directory": str(tmp_path)}
    monkeypatch.chdir(tmp_path)
    for relative in (".", "flows/.."):  # would follow the worker's working directory
        monkeypatch.setenv("EPISODIC_PROJECT_DIR", relative)
        with pytest.raises(FileNotFoundError, match="relative"):
            project_directory()


def test_the_deploy_that_adds_a_scheduler_of_a_pipeline_is_named() -> None:
    """What the build step says when `prefect deploy` exits (it cannot see the deployment
    before Prefect registers it): only pipelines the deploy gave a further scheduler."""
    from episodic.deployments.steps import added_scheduler_warnings

    weekly, copy, third = (f"weekly-episode/{n}" for n in ("weekly", "weekly-copy", "w3"))
    before = {"weekly": [weekly], "other": ["weekly-episode/other"]}
    assert added_scheduler_warnings(before, before) == []
    assert added_scheduler_warnings({}, {"weekly": [weekly]}) == []  # the first one
    (warning,) = added_scheduler_warnings(before, {**before, "weekly": [weekly, copy]})
    assert warning.startswith(
        f"this deploy adds a second deployment scheduling pipeline weekly ({copy}): "
        f"pipeline weekly is scheduled by 2 deployments of the weekly flow ({weekly}, {copy})"
    )
    (warning,) = added_scheduler_warnings({}, {"weekly": [weekly, copy]})  # `--all`, both new
    assert warning.startswith("this deploy adds 2 deployments scheduling pipeline weekly")
    both = {"weekly": [weekly, copy]}
    (warning,) = added_scheduler_warnings(both, {"weekly": [weekly, copy, third]})
    assert warning.startswith(
        f"this deploy adds a third deployment scheduling pipeline weekly ({third})"
    )
    assert added_scheduler_warnings(both, both) == []  # a redeploy: setup's own warning says it


def test_a_deploy_of_every_deployment_says_each_warning_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`prefect deploy --all` runs the build step once per deployment (six here): each of
    its warnings is printed once, on standard error."""
    from episodic.deployments import steps

    for _ in range(6):
        steps._warn("pipeline weekly is scheduled by 2 deployments")
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.count("episodic: warning: pipeline weekly is scheduled by 2") == 1


def test_a_project_dir_too_long_for_the_file_system_is_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from episodic.core.errors import InvalidInput
    from episodic.core.home import project_folder

    monkeypatch.setenv("EPISODIC_PROJECT_DIR", "/" + "a" * 5000)
    with pytest.raises(InvalidInput, match="cannot be read") as caught:
        project_folder()
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 400


def test_a_project_dir_refusal_says_what_is_wrong_with_its_prefect_yaml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A repository's own prefect.yaml that init would keep (not UTF-8, no pull step) is
    named with its fault and mended by hand; a folder without one is told to run init."""
    from episodic.core.errors import InvalidInput
    from episodic.core.home import project_folder

    monkeypatch.setenv("EPISODIC_PROJECT_DIR", str(tmp_path))
    with pytest.raises(InvalidInput, match=r"prefect\.yaml does not exist.*episodic init"):
        project_folder()
    (tmp_path / "prefect.yaml").write_bytes(b"# caf\xe9\npull: []\n")
    with pytest.raises(InvalidInput, match=r"is not UTF-8 text.*: mend it$"):
        project_folder()
    (tmp_path / "prefect.yaml").write_text("pull: []\n")
    with pytest.raises(InvalidInput, match=r"has no pull step.*: mend it$"):
        project_folder()
