"""Provider profiles from YAML: a bad value is refused with the profile, the field and the
rule it breaks, never pydantic's "1 validation error for Profile"."""

from __future__ import annotations

from pathlib import Path

import pytest

from episodic.core.errors import ProviderConfigError
from episodic.providers.profiles import load_profiles


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
    [  # from tests/property/test_file_fuzz.py: none of these may be taken as it is
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
    """`base_url: file://…` is refused: every generate would record a refused create as a
    new paid submission, using up an attempt."""
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


# ---------------------------------------------------------------- prices
PRICE_REFUSALS = [  # (the profile's price fields, the field named, what the line says)
    ("price: {per_image: 0.003}", "price.per_image", "write it as a quoted decimal string"),
    ('price: {per_image: "-0.003"}', "per_image", "expected a plain decimal"),
    ('price: {per_image: "NaN"}', "per_image", "expected a plain decimal"),
    ("price: {per_image: .nan}", "per_image", "nan is not a price; write a plain decimal string"),
    ("price: {per_image: -.inf}", "per_image", "-inf is not a price"),
    ('price: {per_image: "1e-3"}', "per_image", "expected a plain decimal"),
    ('price: {per_image: "0.0000001"}', "per_image", "at most 6 decimals"),
    ('price: {per_image: "0"}', "price", "declare free: true"),
    ('price: {per_image: "0.01"}\n    free: true', "free", "with a price above 0"),
    ('price: {per_image: "0.01"}\n    cost_per_image_minor: 5', "price", "not both"),
    ('price: {per_megapixel: "0.025"}', "at_most", "needs the most megapixels"),
    ('price: {per_megapixel: "0.025", at_most: 1.05}', "price.at_most", "quoted decimal"),
    ('price: {per_image: "0.003", per_second: "0.001"}', "price", "exactly one of"),
    ('price: {per_image: "0.003", whole_megapixels: true}', "whole_megapixels", "per_megapixel"),
]


def _priced(tmp_path: Path, fields: str, kind: str = "http") -> Path:
    path = tmp_path / "providers.yaml"
    path.write_text(
        f"profiles:\n  mine:\n    kind: {kind}\n    base_url: https://images.example.com\n"
        f"    credential_env: IMAGE_KEY\n    {fields}\n"
    )
    return path


@pytest.mark.parametrize(("fields", "field", "rule"), PRICE_REFUSALS)
def test_a_bad_price_is_one_line_naming_the_profile_and_the_field(
    tmp_path: Path, fields: str, field: str, rule: str
) -> None:
    with pytest.raises(ProviderConfigError) as raised:
        load_profiles(_priced(tmp_path, fields))
    message = str(raised.value)
    assert "profile 'mine'" in message and field in message and rule in message, message
    assert "\n" not in message and "Value error" not in message


@pytest.mark.parametrize(("fields", "field", "rule"), PRICE_REFUSALS[:3])
def test_a_bad_price_through_providers_list_is_exit_2_and_one_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    fields: str,
    field: str,
    rule: str,
) -> None:
    from episodic.cli.app import run

    monkeypatch.setenv("EPISODIC_PROVIDERS_FILE", str(_priced(tmp_path, fields)))
    capsys.readouterr()
    assert run(["providers", "list"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: ") and err.count("\n") == 1
    assert "profile 'mine'" in err and field in err and rule in err, err


@pytest.mark.parametrize(
    ("fields", "basis", "unit", "bound"),
    [
        ("cost_per_image_minor: 5", "per_image", 50_000, 1),  # exactly 0.05, as it meant
        ('price: {per_image: "0.003"}', "per_image", 3_000, 1),
        ('price: {per_megapixel: "0.025", at_most: "1.05"}', "per_megapixel", 25_000, 1_050_000),
        (
            'price: {per_megapixel: "0.025", whole_megapixels: true, at_most: "1"}',
            "per_whole_megapixel",
            25_000,
            1_000_000,
        ),
        ('price: {per_second: "0.000725", at_most: "20"}', "per_second", 725, 20_000_000),
        ('price: {per_second: "0.000725"}', "per_second", 725, 60_000_000),  # max_job_s
        ('price: {per_image: "0"}\n    free: true', "per_image", 0, 1),
    ],
)
def test_a_price_is_read_exactly_on_its_basis(
    tmp_path: Path, fields: str, basis: str, unit: int, bound: int
) -> None:
    price = load_profiles(_priced(tmp_path, fields))["mine"].pricing
    assert (price.basis, price.unit_micros, price.estimate_quantity) == (basis, unit, bound)


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ('price: {per_image: "0.003"}', "estimated 0.009 USD: 3 x 1 image at 0.003 USD"),
        (
            'price: {per_megapixel: "0.025", whole_megapixels: true, at_most: "1"}',
            "estimated 0.075 USD: 3 x at most 1 started megapixel at 0.025 USD",
        ),
        (
            'price: {per_megapixel: "0.025", at_most: "1.05"}',
            "estimated 0.07875 USD: 3 x at most 1.05 megapixels at 0.025 USD",
        ),
        (
            'price: {per_second: "0.000725", at_most: "20"}',
            "estimated 0.0435 USD: 3 x at most 20 seconds of compute at 0.000725 USD",
        ),
    ],
)
def test_the_estimate_says_it_is_one_with_its_basis_and_bound(
    tmp_path: Path, fields: str, said: str
) -> None:
    text = load_profiles(_priced(tmp_path, fields))["mine"].estimate_text(3)
    assert text.startswith(said + " (an estimate"), text


def test_the_profiles_docs_show_load_with_the_providers_own_prices(tmp_path: Path) -> None:
    """docs/providers.md's example profiles load, priced as its price table says."""
    docs = (Path(__file__).parents[2] / "docs" / "providers.md").read_text()
    example = docs.split("## Profiles", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "providers.yaml"
    path.write_text(example)
    loaded = load_profiles(path)
    priced = {
        name: (p.pricing.basis, p.pricing.unit_micros, p.pricing.estimate_quantity)
        for name, p in loaded.items()
        if name != "fake"
    }
    assert priced == {
        "flux-replicate": ("per_image", 3_000, 1),  # $0.003 per output image
        "flux-fal": ("per_whole_megapixel", 25_000, 1_000_000),  # $0.025 per started MP
        "own-model-a40": ("per_second", 725, 30_000_000),  # $0.000725 per second
    }
    assert "read 2026-12-02" in docs and "cost_per_image_minor: 25" not in docs


def test_a_dangling_default_providers_symlink_is_refused_not_read_as_no_file(
    tmp_path: Path,
) -> None:
    """The default `$EPISODIC_HOME/providers.yaml` may be absent (built-in profiles only),
    but a symlink to a missing file is a file meant and lost: refused, one line."""
    path = tmp_path / "providers.yaml"
    path.symlink_to(tmp_path / "gone.yaml")
    with pytest.raises(ProviderConfigError, match="symlink to a missing file") as raised:
        load_profiles(path, required=False)
    assert len(str(raised.value).splitlines()) == 1
    assert "fake" in load_profiles(tmp_path / "absent.yaml", required=False)


@pytest.mark.parametrize("field", ["max_concurrency", "max_job_s", "lookup_window_s"])
def test_an_integral_float_is_the_int_its_json_schema_takes(tmp_path: Path, field: str) -> None:
    """JSON Schema's "integer" takes 120.0 (it is 120): the loader reads it so, while a
    fraction, a bool or a string stays refused."""
    path = tmp_path / "providers.yaml"
    base = "profiles:\n  mine:\n    kind: fake\n    cost_per_image_minor: 4\n"
    path.write_text(f"{base}    {field}: 120.0\n")
    value = getattr(load_profiles(path)["mine"], field)
    assert value == 120 and type(value) is int
    for bad in ("120.5", "true", '"120"'):
        path.write_text(f"{base}    {field}: {bad}\n")
        with pytest.raises(ProviderConfigError, match=f"field {field}"):
            load_profiles(path)


@pytest.mark.parametrize(
    ("kind", "name", "value"),
    [
        ("replicate", "num_outputs", "4"),
        ("replicate", "num_outputs", "2"),
        ("replicate", "num_outputs", '"1"'),
        ("replicate", "num_outputs", "true"),
        ("replicate", "num_outputs", "0"),
        ("fal", "num_images", "4"),
        ("fal", "num_images", "1.5"),
    ],
)
def test_a_profile_asking_for_several_images_a_call_is_refused_when_it_loads(
    tmp_path: Path, kind: str, name: str, value: str
) -> None:
    """The provider bills every image of the call, an item keeps one: one line naming the
    profile and the input."""
    path = tmp_path / "providers.yaml"
    model = "owner/model" if kind == "replicate" else "fal-ai/flux/dev"
    path.write_text(
        f"profiles:\n  mine:\n    kind: {kind}\n    model: {model}\n"
        f'    credential_env: KEY\n    price: {{per_image: "0.003"}}\n'
        f"    inputs: {{{name}: {value}}}\n"
    )
    with pytest.raises(ProviderConfigError) as raised:
        load_profiles(path)
    message = str(raised.value)
    assert "profile 'mine'" in message and f"inputs: {name}:" in message and "\n" not in message
    path.write_text(path.read_text().replace(f"{name}: {value}", f"{name}: 1"))
    assert load_profiles(path)["mine"].inputs[name] == 1
