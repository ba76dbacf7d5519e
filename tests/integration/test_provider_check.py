"""`episodic providers check` verifies what it can without spending: the token,
Replicate's model, pinned version and input names, fal's endpoint and input names, against
local servers shaped like the documented APIs (tests/jobs_servers.py); a named providers
file that does not exist, and a Secret block without a Prefect API, are one line, exit 2."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from tests.jobs_servers import FAL_INPUTS, REPLICATE_INPUTS, TOKEN, FalServer, ReplicateServer

VERSION = "c" * 64


@pytest.fixture
def replicate() -> Iterator[ReplicateServer]:
    with ReplicateServer() as server:
        yield server  # type: ignore[misc]


@pytest.fixture
def fal() -> Iterator[FalServer]:
    with FalServer() as server:
        yield server  # type: ignore[misc]


@pytest.fixture
def providers_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "providers.yaml"
    monkeypatch.setenv("EPISODIC_PROVIDERS_FILE", str(path))
    monkeypatch.setenv("REP_TOKEN", TOKEN)
    monkeypatch.setenv("FAL_TOKEN", TOKEN)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    return path


def write(path: Path, kind: str, server: ReplicateServer | FalServer, *lines: str) -> None:
    token = "REP_TOKEN" if kind == "replicate" else "FAL_TOKEN"
    extra = "".join(f"    {line}\n" for line in lines)
    schema = f"    schema_url: {server.schema_url}\n" if isinstance(server, FalServer) else ""
    path.write_text(
        f"profiles:\n  p:\n    kind: {kind}\n    base_url: {server.base_url}\n{schema}"
        f'    credential_env: {token}\n    price: {{per_image: "0.003"}}\n{extra}'
    )


def check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    from episodic.cli.app import run

    capsys.readouterr()
    code = run(["providers", "check", "p", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_replicate_an_unknown_model_is_one_line_exit_2(
    replicate: ReplicateServer, providers_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    replicate.models = {"black-forest-labs/flux-schnell": REPLICATE_INPUTS}
    write(providers_file, "replicate", replicate, "model: black-forest-labs/flux-schnel")
    code, out, _ = check(capsys, "--json")
    assert code == 2
    shown = json.loads(out)["check"]
    assert shown["ok"] is False
    assert shown["message"] == ("profile 'p': Replicate has no model black-forest-labs/flux-schnel")
    assert not replicate.jobs_made


def test_replicate_a_misspelled_input_names_it_and_its_close_match(
    replicate: ReplicateServer, providers_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(
        providers_file,
        "replicate",
        replicate,
        "model: black-forest-labs/flux-schnell",
        "prompt_input: promt",
        'inputs: {aspect_ration: "1:1", num_outputs: 1}',
    )
    code, out, _ = check(capsys, "--json")
    assert code == 2
    line = json.loads(out)["check"]["message"]
    assert "'promt' (did you mean prompt?)" in line
    assert "'aspect_ration' (did you mean aspect_ratio?)" in line
    assert "num_outputs" not in line.split("schema")[0]  # a known input is not named wrong
    assert [r.path for r in replicate.requests] == [
        "/v1/account",
        "/v1/models/black-forest-labs/flux-schnell",
    ]


def test_replicate_a_pinned_version_is_checked_and_its_schema_is_the_one_read(
    replicate: ReplicateServer, providers_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    replicate.versions = {VERSION: {"prompt": {}, "seed": {}, "steps": {}}}
    write(
        providers_file,
        "replicate",
        replicate,
        "model: someone/own-model",
        f"version: {VERSION}",
        "inputs: {steps: 4}",
    )
    code, out, _ = check(capsys, "--json")
    assert code == 0, out
    assert json.loads(out)["check"]["ok"] is True
    assert replicate.requests[-1].path == f"/v1/models/someone/own-model/versions/{VERSION}"
    # the latest version's schema (flux-schnell's here) would have refused `steps`
    write(
        providers_file, "replicate", replicate, "model: someone/own-model", f"version: {'d' * 64}"
    )
    code, out, _ = check(capsys, "--json")
    assert code == 2
    assert json.loads(out)["check"]["message"] == (
        f"profile 'p': Replicate has no version {'d' * 64} of model someone/own-model"
    )


def test_replicate_a_model_endpoint_that_does_not_answer_is_exit_1(
    replicate: ReplicateServer, providers_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    replicate.reply = lambda kind, path: (503, {"detail": "busy"}) if "/models/" in path else None
    write(providers_file, "replicate", replicate, "model: black-forest-labs/flux-schnell")
    code, out, _ = check(capsys)
    assert code == 1
    assert out.splitlines()[-1].startswith("check: no answer: ")


def test_fal_the_endpoint_and_its_inputs_are_checked_from_its_public_schema(
    fal: FalServer, providers_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fal.models = {"fal-ai/flux/dev": FAL_INPUTS}
    write(providers_file, "fal", fal, "model: fal-ai/flux/dev", "inputs: {image_size: square}")
    code, out, _ = check(capsys, "--json")
    assert code == 0
    shown = json.loads(out)["check"]
    assert shown["ok"] is None and shown["message"].startswith(
        "endpoint fal-ai/flux/dev takes every configured input (prompt, seed, image_size)"
    )
    write(providers_file, "fal", fal, "model: fal-ai/flux/schnell")
    code, out, _ = check(capsys)
    assert (code, out.splitlines()[-1]) == (
        2,
        "check: profile 'p': fal has no endpoint fal-ai/flux/schnell",
    )
    write(providers_file, "fal", fal, "model: fal-ai/flux/dev", "inputs: {image_sise: square}")
    code, out, _ = check(capsys, "--json")
    message = json.loads(out)["check"]["message"]
    assert code == 2 and "input 'image_sise' (did you mean image_size" in message
    assert fal.requests == [] and not fal.jobs_made  # the API (and the key) never reached


def test_a_named_providers_file_that_does_not_exist_is_one_line_exit_2(
    providers_file: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from episodic.cli.app import run

    for args in (["providers", "list"], ["providers", "check", "fake"]):
        capsys.readouterr()
        assert run(args) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{providers_file} does not exist" in err
    monkeypatch.delenv("EPISODIC_PROVIDERS_FILE")  # the default path, absent: built-ins only
    assert run(["providers", "list"]) == 0


def test_a_secret_block_without_a_prefect_api_says_how_to_configure_one(
    replicate: ReplicateServer,
    providers_file: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    providers_file.write_text(
        "profiles:\n  p:\n    kind: replicate\n    model: black-forest-labs/flux-schnell\n"
        f"    base_url: {replicate.base_url}\n    credential_secret_block: rep-token\n"
        '    price: {per_image: "0.003"}\n'
    )
    # Prefect cannot be imported: a temporary server could not start unnoticed
    monkeypatch.setitem(sys.modules, "prefect.blocks.system", None)  # type: ignore[arg-type]
    code, out, err = check(capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "unexpected" not in err
    assert "export PREFECT_API_URL=" in err and "credential_env" in err
    assert replicate.requests == []


def test_the_profiles_init_writes_pass_the_check_against_the_documented_schemas(
    replicate: ReplicateServer,
    fal: FalServer,
    providers_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import yaml

    from episodic.cli.app import run

    replicate.models = {
        "black-forest-labs/flux-schnell": REPLICATE_INPUTS,
        "black-forest-labs/flux-dev": REPLICATE_INPUTS,
    }
    fal.models = {"fal-ai/flux/schnell": FAL_INPUTS, "fal-ai/flux/dev": FAL_INPUTS}
    monkeypatch.delenv("EPISODIC_PROVIDERS_FILE")
    assert run(["init", "--playlist", str(tmp_path / "playlist.yaml")]) == 0
    written = yaml.safe_load((tmp_path / "home" / "providers.yaml").read_text())
    for profile in written["profiles"].values():  # the local servers, as a test's proxy
        if profile["kind"] == "replicate":
            profile |= {"base_url": replicate.base_url, "credential_env": "REP_TOKEN"}
        else:
            profile |= {"base_url": fal.base_url, "schema_url": fal.schema_url}
            profile["credential_env"] = "FAL_TOKEN"
    providers_file.write_text(yaml.safe_dump(written))
    monkeypatch.setenv("EPISODIC_PROVIDERS_FILE", str(providers_file))
    for name in written["profiles"]:
        capsys.readouterr()
        assert run(["providers", "check", name, "--json"]) == 0, capsys.readouterr()
        assert json.loads(capsys.readouterr().out)["check"]["ok"] is not False
    assert not replicate.jobs_made and not fal.jobs_made


def test_generate_with_a_secret_block_profile_and_no_prefect_api_is_one_line_exit_2(
    engine: Engine,
    replicate: ReplicateServer,
    providers_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """generate read credentials from the environment only: "names no credential_env"."""
    from episodic.cli.app import run
    from tests.generation import new_episode, write_playlist

    providers_file.write_text(
        "profiles:\n  p:\n    kind: replicate\n    model: black-forest-labs/flux-schnell\n"
        f"    base_url: {replicate.base_url}\n    credential_secret_block: rep-token\n"
        '    price: {per_image: "0.003"}\n'
    )
    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "pl", ["a", "b"], profile="p"))
    monkeypatch.setitem(sys.modules, "prefect.blocks.system", None)  # type: ignore[arg-type]
    capsys.readouterr()
    assert run(["generate", episode.episode_id]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "export PREFECT_API_URL=" in err
    assert "names no credential_env" not in err
    assert replicate.requests == [] and not replicate.jobs_made


def test_a_prefect_api_that_does_not_answer_is_one_line_exit_1(
    replicate: ReplicateServer,
    providers_file: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    providers_file.write_text(
        "profiles:\n  p:\n    kind: replicate\n    model: black-forest-labs/flux-schnell\n"
        f"    base_url: {replicate.base_url}\n    credential_secret_block: rep-token\n"
        '    price: {per_image: "0.003"}\n'
    )
    from prefect.settings import PREFECT_API_URL, temporary_settings

    url = f"http://127.0.0.1:{port}/api"
    monkeypatch.setenv("PREFECT_API_URL", url)  # what the command line reads, and what
    with temporary_settings(updates={PREFECT_API_URL: url}):  # an imported Prefect has read
        code, out, err = check(capsys)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "the Prefect API did not answer" in err
    assert "unexpected" not in err and replicate.requests == []
