"""`episodic init` writes a providers file and a playlist skeleton that load and validate,
never over an existing file; `episodic schema playlist|providers` prints JSON Schemas
(draft 2020-12) that the example and the written files pass and a mistyped field fails."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator

from episodic.core.home import project_folder
from episodic.pipeline.playlists import load_playlist
from episodic.providers.profiles import load_profiles


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    from episodic.cli.app import run

    capsys.readouterr()
    code = run(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def schema_of(capsys: pytest.CaptureFixture[str], kind: str) -> Draft202012Validator:
    code, out, _ = cli(capsys, "schema", kind)
    assert code == 0
    schema = json.loads(out)
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["title"] and schema["description"]
    return Draft202012Validator(schema)


def errors(validator: Draft202012Validator, document: Any) -> list[str]:
    return [error.message for error in validator.iter_errors(document)]


def test_init_writes_a_providers_file_and_a_playlist_that_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    playlist = tmp_path / "project" / "playlist.yaml"
    code, out, _ = cli(capsys, "init", "--playlist", str(playlist), "--json")
    assert code == 0
    home = tmp_path / "home"  # EPISODIC_HOME (tests/conftest.py)
    assert json.loads(out) == {
        "files": [
            {"what": "providers", "path": str(home / "providers.yaml"), "status": "written"},
            {"what": "playlist", "path": str(playlist), "status": "written"},
        ]
    }
    profiles = load_profiles(home / "providers.yaml", required=True)
    prices = {
        name: (p.kind, p.model, p.basis, p.unit_micros)
        for name, p in profiles.items()
        if name != "fake"
    }
    assert prices == {
        "replicate-flux-schnell": (
            "replicate",
            "black-forest-labs/flux-schnell",
            "per_image",
            3_000,
        ),
        "replicate-flux-dev": ("replicate", "black-forest-labs/flux-dev", "per_image", 25_000),
        "fal-flux-schnell": ("fal", "fal-ai/flux/schnell", "per_whole_megapixel", 3_000),
        "fal-flux-dev": ("fal", "fal-ai/flux/dev", "per_whole_megapixel", 25_000),
    }
    parsed, references = load_playlist(playlist)
    assert parsed.provider_profile in profiles and references == []
    assert (home / ".episodic-state").is_file()  # the state folder it made is marked


def test_init_keeps_every_existing_file_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    providers = tmp_path / "mine.yaml"
    providers.write_text("profiles: {}\n")
    monkeypatch.setenv("EPISODIC_PROVIDERS_FILE", str(providers))
    playlist = tmp_path / "playlist.yaml"
    code, out, _ = cli(capsys, "init", "--playlist", str(playlist))
    assert code == 0
    assert f"providers: kept (it exists; not overwritten) {providers}" in out
    assert f"playlist: wrote {playlist}" in out
    assert providers.read_text() == "profiles: {}\n"
    written = playlist.read_text()
    playlist.write_text(written + "# my edit\n")
    code, out, _ = cli(capsys, "init", "--playlist", str(playlist), "--json")
    assert code == 0
    assert [f["status"] for f in json.loads(out)["files"]] == ["kept", "kept"]
    assert playlist.read_text() == written + "# my edit\n"


def test_init_and_schema_have_help(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("init", "schema"):
        code, out, _ = cli(capsys, command, "--help")
        assert code == 0 and "--help" in out


def test_the_schemas_pass_the_example_and_the_written_files_and_flag_a_mistyped_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    playlist_schema = schema_of(capsys, "playlist")
    providers_schema = schema_of(capsys, "providers")
    project = project_folder()
    assert project is not None
    example = yaml.safe_load((project / "examples" / "playlist.yaml").read_text())
    assert errors(playlist_schema, example) == []
    playlist = tmp_path / "playlist.yaml"
    assert cli(capsys, "init", "--playlist", str(playlist))[0] == 0
    written = yaml.safe_load(playlist.read_text())
    assert errors(playlist_schema, written) == []
    providers = yaml.safe_load((tmp_path / "home" / "providers.yaml").read_text())
    assert errors(providers_schema, providers) == []

    written["items"][0]["titel"] = written["items"][0].pop("title")
    assert any("'titel' was unexpected" in e for e in errors(playlist_schema, written))
    profile = providers["profiles"]["replicate-flux-schnell"]
    profile["credentail_env"] = profile.pop("credential_env")
    assert any("'credentail_env' was unexpected" in e for e in errors(providers_schema, providers))
    profile["credential_env"] = profile.pop("credentail_env")
    profile["price"] = {"per_image": 0.003}  # a YAML number: the models want a string
    assert errors(providers_schema, providers) != []
    providers["profile"] = providers.pop("profiles")
    assert any("'profile' was unexpected" in e for e in errors(providers_schema, providers))


def test_schema_descriptions_say_what_the_fields_mean(capsys: pytest.CaptureFixture[str]) -> None:
    schema = schema_of(capsys, "providers").schema
    fields = schema["$defs"]["Profile"]["properties"]
    assert "id" not in fields  # a profile's id is its key under `profiles`
    assert "Prefect Secret block" in fields["credential_secret_block"]["description"]
    assert schema["$defs"]["Profile"]["additionalProperties"] is False
    code, _, err = cli(capsys, "schema", "profiles")
    assert code == 2 and err.count("\n") == 1


@pytest.mark.parametrize("name", [".", ""])
def test_init_with_a_playlist_naming_a_folder_is_refused_not_kept(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    name: str,
) -> None:
    """`--playlist .` (or ''): the working folder is there, but no playlist is: exit 2 and
    one line, never "kept"."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EPISODIC_PROVIDERS_FILE", str(tmp_path / "providers.yaml"))
    code, out, err = cli(capsys, "init", "--playlist", name, "--json")
    assert code == 2, out
    assert err.startswith("error: playlist file ") and "folder" in err, err
    assert len(err.splitlines()) == 1


def test_a_team_repositorys_prefect_yaml_deploys_what_the_checkouts_does(tmp_path: Path) -> None:
    """The `prefect.yaml` init writes into a team's repository has the checkout's steps,
    deployments, entrypoints and schedules; only the weekly playlist differs (the team's own,
    relative to its repository), so the two cannot drift apart."""
    import yaml

    from episodic.pipeline.starter import prefect_yaml

    root = Path(__file__).resolve().parents[2]
    ours = yaml.safe_load((root / "prefect.yaml").read_text())
    team_repo = tmp_path / "team"
    theirs = yaml.safe_load(prefect_yaml(team_repo, team_repo / "media" / "weekly.yaml"))
    (weekly,) = [d for d in theirs["deployments"] if d["name"] == "weekly"]
    assert weekly["parameters"] == {"pipeline": "weekly", "playlist": "media/weekly.yaml"}
    weekly["parameters"]["playlist"] = "examples/playlist.yaml"
    assert theirs == ours
    outside = yaml.safe_load(prefect_yaml(team_repo, tmp_path / "elsewhere.yaml"))
    (weekly,) = [d for d in outside["deployments"] if d["name"] == "weekly"]
    assert weekly["parameters"]["playlist"] == str(tmp_path / "elsewhere.yaml")


def test_a_target_that_is_not_a_file_refuses_before_anything_is_written(tmp_path: Path) -> None:
    """The third file's path is a folder: init refuses (InvalidInput, 'nothing written') and
    has written neither of the first two."""
    from episodic.core.errors import InvalidInput
    from episodic.pipeline.starter import write_starter_files

    prefect = tmp_path / "prefect.yaml"
    prefect.mkdir()
    providers, playlist = tmp_path / "providers.yaml", tmp_path / "playlist.yaml"
    with pytest.raises(InvalidInput, match="is a folder; name a file: nothing written"):
        write_starter_files(providers, playlist, prefect)
    assert not providers.exists() and not playlist.exists()


def test_an_ignore_file_that_is_not_text_refuses_before_anything_is_written(
    tmp_path: Path,
) -> None:
    from episodic.core.errors import InvalidInput
    from episodic.pipeline.starter import write_starter_files

    (tmp_path / ".gitignore").write_bytes(b"caf\xe9\n")  # Latin-1, not UTF-8
    with pytest.raises(InvalidInput, match="nothing written"):
        write_starter_files(
            tmp_path / "providers.yaml", tmp_path / "playlist.yaml", tmp_path / "prefect.yaml"
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == [".gitignore"]
    assert (tmp_path / ".gitignore").read_bytes() == b"caf\xe9\n"


@pytest.mark.parametrize(
    ("text", "ignored"),
    [
        (".episodic/\n", True),
        ("/.episodic\n", True),
        (".episodic/  \n", True),  # trailing spaces are not part of a rule
        ("  .episodic/\n", False),  # leading ones are: it names another path
        (".episodic/\n!.episodic/\n", False),  # the last rule takes it back
        ("!.episodic/\n.episodic/\n", True),
        (".episodic/\n!.episodic/providers.yaml\n", False),  # part of it is kept again
        ("# .episodic/\n", False),
        (".episodic/**\n", False),
    ],
)
def test_an_ignore_file_ignores_the_state_folder_as_git_reads_its_rules(
    text: str, ignored: bool
) -> None:
    from episodic.pipeline.starter import ignores_state_folder

    assert ignores_state_folder(text) is ignored


def test_the_state_folders_line_is_added_in_the_files_own_line_endings(tmp_path: Path) -> None:
    from episodic.pipeline.starter import write_starter_files

    (tmp_path / ".dockerignore").write_bytes(b"node_modules\r\n.venv")
    write_starter_files(
        tmp_path / "providers.yaml", tmp_path / "playlist.yaml", tmp_path / "prefect.yaml"
    )
    lines = (tmp_path / ".dockerignore").read_bytes().split(b"\r\n")
    assert lines[:2] == [b"node_modules", b".venv"] and b".episodic/" in lines
    assert b"\n" not in b"".join(lines)  # no bare newline anywhere
