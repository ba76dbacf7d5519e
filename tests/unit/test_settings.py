from __future__ import annotations

import pytest

from episodic.core.errors import InvalidInput
from episodic.core.settings import load_settings


def test_defaults(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("EPISODIC_HOME", str(tmp_path))
    settings = load_settings()
    assert settings.pipeline == "weekly"
    assert settings.timezone == "UTC"
    assert settings.url == f"sqlite:///{tmp_path / 'episodic.db'}"


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("EPISODIC_TIMEZONE", "Mars/Base", "EPISODIC_TIMEZONE"),
        ("EPISODIC_PIPELINE", "Has Spaces", "EPISODIC_PIPELINE"),
        ("EPISODIC_PIPELINE", "../up", "EPISODIC_PIPELINE"),
        ("EPISODIC_LEASE_S", "2", "EPISODIC_LEASE_S"),  # too short to renew under load
        ("EPISODIC_LEASE_S", "nan", "EPISODIC_LEASE_S"),
        ("EPISODIC_DEDUP_WINDOW_S", "-1", "EPISODIC_DEDUP_WINDOW_S"),
        ("EPISODIC_DEDUP_WINDOW_S", "1e309", "EPISODIC_DEDUP_WINDOW_S"),
        ("EPISODIC_PENDING_TTL_S", "0", "EPISODIC_PENDING_TTL_S"),
        ("EPISODIC_PENDING_TTL_S", "inf", "EPISODIC_PENDING_TTL_S"),
        ("EPISODIC_HOME", "/dev/null", "EPISODIC_HOME: /dev/null exists and is not a dir"),
        ("EPISODIC_HOME", "/dev/null/x", "EPISODIC_HOME: /dev/null/x cannot be created"),
        ("EPISODIC_MAX_RUN_COST", "1e9", "EPISODIC_MAX_RUN_COST"),
        ("EPISODIC_MAX_RUN_COST", "-5", "EPISODIC_MAX_RUN_COST"),
    ],
)
def test_bad_values_name_the_variable(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, message: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(InvalidInput, match=message):
        load_settings()


@pytest.mark.parametrize("name", ["localtime", "Factory", "posixrules", "../../etc/passwd", ""])
def test_host_dependent_and_unknown_zones_are_refused(name: str) -> None:
    from episodic.core.settings import load_timezone

    with pytest.raises(InvalidInput, match="unknown timezone"):
        load_timezone(name)


def test_flow_parameter_patterns_refuse_impossible_weeks() -> None:
    import re

    from episodic.flows.params import EPISODE_ID_PATTERN, WEEK_PATTERN

    assert re.match(WEEK_PATTERN, "2026-W01") and re.match(WEEK_PATTERN, "2026-W53")
    for bad in ("2026-W00", "2026-W54", "2026-W99", "2026-W1"):
        assert not re.match(WEEK_PATTERN, bad), bad
    assert re.match(EPISODE_ID_PATTERN, "2026-W32-10")
    assert not re.match(EPISODE_ID_PATTERN, "2026-W99-0")
    assert not re.match(EPISODE_ID_PATTERN, "2026-W32-01")


def test_the_media_store_defaults_to_a_folder_in_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    monkeypatch.setenv("EPISODIC_HOME", str(tmp_path))
    settings = load_settings()
    assert settings.media_url is None
    assert settings.media_store_url == str(tmp_path / "media")
    monkeypatch.setenv("EPISODIC_MEDIA_URL", "s3://bucket/episodic")
    assert load_settings().media_store_url == "s3://bucket/episodic"


@pytest.mark.parametrize(
    "url",
    [
        "s3://AKIAEXAMPLEKEY:wJalrSECRET@bucket/prefix",
        "s3://AKIAEXAMPLEKEY@bucket/prefix",
        "gs://user:wJalrSECRET@bucket",
        "az://container:wJalrSECRET@account/path",
        "s3://bucket/prefix?secret=wJalrSECRET",
    ],
)
def test_a_media_url_with_credentials_is_refused_without_repeating_them(
    monkeypatch: pytest.MonkeyPatch, url: str
) -> None:
    monkeypatch.setenv("EPISODIC_MEDIA_URL", url)
    with pytest.raises(InvalidInput, match="EPISODIC_MEDIA_URL") as caught:
        load_settings()
    assert "wJalrSECRET" not in str(caught.value) and "AKIAEXAMPLEKEY" not in str(caught.value)


def test_an_empty_providers_file_is_unset_and_a_tilde_is_the_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    """EPISODIC_PROVIDERS_FILE="" is no file at all, not the path "." ("does not exist");
    "~/p.yaml" is under the home folder, not a folder named "~" in the working directory."""
    monkeypatch.setenv("EPISODIC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HOME", str(tmp_path / "me"))
    monkeypatch.setenv("EPISODIC_PROVIDERS_FILE", "")
    settings = load_settings()
    assert settings.providers_file is None
    assert settings.providers_path == tmp_path / "home" / "providers.yaml"
    monkeypatch.setenv("EPISODIC_PROVIDERS_FILE", "~/p.yaml")
    assert load_settings().providers_path == tmp_path / "me" / "p.yaml"
