"""Provider profiles from YAML: a bad value is refused with the profile, the field and the
rule it breaks (found by a fresh tester: the message said "1 validation error for Profile")."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.errors import ProviderConfigError
from providers.profiles import load_profiles


@pytest.mark.parametrize(
    ("value", "rule"),
    [
        ("0", "greater than or equal to 1"),
        ("-5", "greater than or equal to 1"),
        ("86401", "less than or equal to 86400"),
        ("1.5", "valid integer"),
        ('"60"', "valid integer"),
        ("abc", "valid integer"),
        ("null", "valid integer"),
    ],
)
def test_a_bad_max_job_s_names_profile_field_and_rule(
    tmp_path: Path, value: str, rule: str
) -> None:
    path = tmp_path / "providers.yaml"
    path.write_text(
        f"profiles:\n  mine:\n    kind: fake\n    cost_per_image_minor: 4\n    max_job_s: {value}\n"
    )
    with pytest.raises(ProviderConfigError) as raised:
        load_profiles(path)
    message = str(raised.value)
    assert "profile 'mine'" in message and "field max_job_s" in message and rule in message
    assert "\n" not in message


def test_max_job_s_defaults_to_a_minute_and_takes_a_day_at_most(tmp_path: Path) -> None:
    path = tmp_path / "providers.yaml"
    path.write_text(
        "profiles:\n  a:\n    kind: fake\n    cost_per_image_minor: 4\n"
        "  b:\n    kind: fake\n    cost_per_image_minor: 4\n    max_job_s: 86400\n"
    )
    profiles = load_profiles(path)
    assert profiles["a"].max_job_s == 60 and profiles["b"].max_job_s == 86400


@pytest.mark.parametrize(
    ("field", "value", "rule"),
    [  # found by tests/property/test_file_fuzz.py: each of these was taken as it was
        ("delay_ms", str(10**400), "less than or equal to 3600000"),
        ("timeout_s", "true", "valid number"),
        ("timeout_s", ".nan", "finite number"),
        ("lookup", '"yes"', "valid boolean"),
        ("credential_secret_block", '"../x"', "pattern"),
    ],
)
def test_a_profile_value_of_the_wrong_type_is_refused_not_coerced(
    tmp_path: Path, field: str, value: str, rule: str
) -> None:
    path = tmp_path / "providers.yaml"
    path.write_text(
        f"profiles:\n  mine:\n    kind: fake\n    cost_per_image_minor: 4\n    {field}: {value}\n"
    )
    with pytest.raises(ProviderConfigError) as raised:
        load_profiles(path)
    assert f"field {field}" in str(raised.value) and rule in str(raised.value)


@pytest.mark.parametrize(
    "content", ["[" * 5000, "profiles: {a: {kind: fake}, a: {kind: http}}", "profile: {}"]
)
def test_a_profiles_file_that_is_not_ours_is_one_provider_config_error(
    tmp_path: Path, content: str
) -> None:
    path = tmp_path / "providers.yaml"
    path.write_text(content)
    with pytest.raises(ProviderConfigError) as raised:
        load_profiles(path)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    ("url", "rule"),
    [
        ("file:///etc/passwd", "http:// or https://"),
        ("ftp://images.example.com/v1", "http:// or https://"),
        ("https://", "http:// or https://"),
        ("images.example.com/v1", "http:// or https://"),
        ('"https://user:pw@images.example.com/v1"', "user or password"),
        ('"https://images.example.com/v1\\x01"', "control characters"),
    ],
)
def test_an_http_profile_base_url_is_an_http_origin(tmp_path: Path, url: str, rule: str) -> None:
    """`base_url: file://…` was accepted; every generate then recorded a refused create as a
    new paid submission, using up an attempt (found by a fresh tester)."""
    path = tmp_path / "providers.yaml"
    path.write_text(
        f"profiles:\n  api:\n    kind: http\n    cost_per_image_minor: 4\n    base_url: {url}\n"
    )
    with pytest.raises(ProviderConfigError) as raised:
        load_profiles(path)
    message = str(raised.value)
    assert "field base_url" in message and rule in message and "\n" not in message
    assert "pw" not in message


def test_an_https_base_url_with_a_port_and_path_is_taken(tmp_path: Path) -> None:
    path = tmp_path / "providers.yaml"
    path.write_text(
        "profiles:\n  api:\n    kind: http\n    cost_per_image_minor: 4\n"
        "    base_url: https://images.example.com:8443/v1\n"
    )
    assert load_profiles(path)["api"].base_url == "https://images.example.com:8443/v1"
