"""The provider seam: one kind -> adapter table builds every client, and what an adapter can
do beyond the protocol is declared once, by its class, and said alike by `providers list`."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

import pytest

from bench import house
from episodic.core.errors import ProviderConfigError
from episodic.pipeline.provider_check import capability_row
from episodic.providers.adapters import ADAPTERS, build_client
from episodic.providers.base import CancelsJobs, ChecksCredential, DescribesJobs, Provider
from episodic.providers.profiles import Profile

ROOT = Path(__file__).resolve().parents[2]
ADAPTER_MODULES = {
    "episodic.providers.fake",
    "episodic.providers.http",
    "episodic.providers.replicate",
    "episodic.providers.fal",
}
KINDS = typing.get_args(Profile.model_fields["kind"].annotation)


def _profile(kind: str) -> Profile:
    extra: dict[str, object] = {
        "fake": {},
        "http": {"base_url": "http://127.0.0.1:9", "credential_env": "TOKEN"},
        "replicate": {"model": "owner/name", "credential_env": "TOKEN"},
        "fal": {"model": "fal-ai/flux/dev", "credential_env": "TOKEN"},
    }[kind]
    return Profile.model_validate(
        {"id": f"{kind}-x", "kind": kind, "cost_per_image_minor": 3, **extra}
    )


def _client(kind: str, tmp_path: Path) -> Provider:
    return build_client(_profile(kind), None if kind == "fake" else "tok", tmp_path)


def test_every_profile_kind_has_one_adapter() -> None:
    assert set(ADAPTERS) == set(KINDS)


@pytest.mark.parametrize("kind", KINDS)
def test_the_capability_row_says_what_the_adapter_class_declares(kind: str, tmp_path: Path) -> None:
    client = _client(kind, tmp_path)
    try:
        row = capability_row(_profile(kind))
        assert (row.cancel != "no") == isinstance(client, CancelsJobs)
        # jobs that carry a reference of ours are found by it; the others are described
        assert isinstance(client, DescribesJobs) == (kind in ("replicate", "fal"))
        assert isinstance(client, ChecksCredential) == (kind != "fake")
    finally:
        client.close()


@pytest.mark.parametrize("kind", ["http", "replicate", "fal"])
def test_a_kind_that_needs_a_credential_is_never_built_without_one(
    kind: str, tmp_path: Path
) -> None:
    with pytest.raises(ProviderConfigError, match="needs a credential"):
        build_client(_profile(kind), None, tmp_path)


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def test_only_the_kind_table_imports_an_adapter_outside_the_adapters() -> None:
    """So `providers.adapters` is the one place a client is built (tests and bench build their
    own)."""
    product = house.PRODUCT_PACKAGES
    wrong = {
        str(path.relative_to(ROOT)): sorted(_imports(path) & ADAPTER_MODULES)
        for package in product
        for path in sorted((ROOT / package).rglob("*.py"))
        if path.relative_to(ROOT).as_posix() != "providers/adapters.py"
        and "episodic." + path.relative_to(ROOT).with_suffix("").as_posix().replace("/", ".")
        not in ADAPTER_MODULES
    }
    assert {module: names for module, names in wrong.items() if names} == {}
