"""`episodic schema` and the loaders agree on the shape of a file (not on the cross-field
rules the schema says it leaves to `plan` and `providers check`): otherwise an editor flags
a file that loads, or passes one that is refused."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from episodic.core.documents import parse_yaml
from episodic.core.home import project_folder
from episodic.pipeline.playlists import InvalidPlaylist, parse_playlist
from episodic.pipeline.schemas import json_schema
from episodic.providers.profiles import ProviderConfigError, load_profiles


def _example() -> Any:
    folder = project_folder()
    assert folder is not None
    return parse_yaml((folder / "examples" / "playlist.yaml").read_text())


def _playlist_loads(document: Any) -> bool:
    try:
        parse_playlist(document, "test")
    except InvalidPlaylist:
        return False
    return True


def _schema_passes(kind: str, document: Any) -> bool:
    return not list(Draft202012Validator(json_schema(kind)).iter_errors(document))


@pytest.mark.parametrize(
    ("case", "path", "value"),
    [
        # JSON Schema's "integer" takes 1001.0; the loader's strict int refuses it
        ("seed 1001.0", ("items", 0, "seed"), 1001.0),
        ("version 1.0", ("template", "version"), 1.0),
        # parts are 1 to 9, distinct: the schema says only "integers"
        ("parts [0]", ("items", 0, "parts"), [0]),
        ("parts [1, 1]", ("items", 0, "parts"), [1, 1]),
    ],
)
def test_the_playlist_schema_and_loader_agree_on_a_field(
    case: str, path: tuple[Any, ...], value: Any
) -> None:
    document = copy.deepcopy(_example())
    target = document
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    assert _playlist_loads(document) == _schema_passes("playlist", document), case


@pytest.mark.parametrize(
    ("case", "text"),
    [
        ("an empty file (loads: no profiles)", ""),
        (
            "max_concurrency 4.0",
            "profiles:\n  p: {kind: fake, price: {per_image: '0.01'}, max_concurrency: 4.0}\n",
        ),
    ],
)
def test_the_providers_schema_and_loader_agree_on_a_file(
    case: str, text: str, tmp_path: Any
) -> None:
    path = tmp_path / "providers.yaml"
    path.write_text(text)
    try:
        load_profiles(path, required=True)
        loads = True
    except ProviderConfigError:
        loads = False
    assert loads == _schema_passes("providers", parse_yaml(text)), case
