"""The generate request: one set of rules for the CLI, the generate flow and the Python API."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prefect.exceptions import ParameterTypeError

from episodic.core.errors import InvalidInput
from episodic.core.money import parse_money
from episodic.core.planning import GenerateRequest

EPISODE = "2026-W32-0"
AMOUNTS_THE_CLI_TAKES = ["0.003", "0.000725", "12.50", "5", "0", " 2.50 ", "999999999.999999"]
AMOUNTS_THE_CLI_REFUSES = ["1.0000001", "-1", "1e3", "NaN", "inf", "", "1,50", "١٢", "1000000000"]


def flow_params(**params: Any) -> dict[str, Any]:
    from episodic.flows.generate import generate_episode

    validated: dict[str, Any] = generate_episode.validate_parameters(
        {"episode_id": EPISODE, **params}
    )
    return validated


@pytest.mark.parametrize("amount", AMOUNTS_THE_CLI_TAKES)
def test_the_generate_flow_takes_every_max_cost_the_cli_takes(amount: str) -> None:
    assert flow_params(max_cost=amount)["max_cost"] == amount
    assert GenerateRequest(EPISODE, max_cost=amount).max_cost == amount


@pytest.mark.parametrize("amount", AMOUNTS_THE_CLI_REFUSES)
def test_the_generate_flow_refuses_every_max_cost_the_cli_refuses(amount: str) -> None:
    with pytest.raises(ParameterTypeError):
        flow_params(max_cost=amount)
    with pytest.raises(InvalidInput, match="invalid amount"):
        GenerateRequest(EPISODE, max_cost=amount)


def test_an_amount_is_held_in_micro_units() -> None:
    assert GenerateRequest(EPISODE, max_cost="0.003").max_cost_micros == 3_000
    assert GenerateRequest(EPISODE, max_cost="12.50").max_cost_micros == 12_500_000
    assert GenerateRequest(EPISODE).max_cost_micros is None


EDGES = [
    ("concurrency", 1, 64),
    ("max_retries", 0, 20),
    ("max_images", 0, 999_999_999),
    ("hero_candidates", 1, 50),
]


@pytest.mark.parametrize(("name", "low", "high"), EDGES)
def test_numbers_in_range_pass_both_doors_and_one_past_an_end_neither(
    name: str, low: int, high: int
) -> None:
    given: dict[str, Any]
    for value in (low, high):
        given = {name: value}
        assert flow_params(**given)[name] == value
        assert getattr(GenerateRequest(EPISODE, **given), name) == value
    for wrong in (low - 1, high + 1, True, 2.0, "4"):
        given = {name: wrong}
        with pytest.raises(ParameterTypeError):
            flow_params(**given)
        with pytest.raises(InvalidInput, match="expected a whole number"):
            GenerateRequest(EPISODE, **given)


def test_the_collect_timeout_and_the_flags_are_checked() -> None:
    assert GenerateRequest(EPISODE, collect_timeout_s=86_400).collect_timeout_s == 86_400
    with pytest.raises(InvalidInput, match="--collect-timeout"):
        GenerateRequest(EPISODE, collect_timeout_s=0)
    with pytest.raises(InvalidInput, match="--allow-duplicate"):
        GenerateRequest(EPISODE, allow_duplicate=1)  # type: ignore[arg-type]


def test_a_selection_the_cli_takes_is_taken_by_the_flow() -> None:
    long = ",".join(["v01"] * 2000)  # 7999 characters: within the CLI's limit
    assert flow_params(only=long)["only"] == long
    assert GenerateRequest(EPISODE, only=long).only == long
    with pytest.raises(ParameterTypeError):
        flow_params(only="1" * 10_001)
    with pytest.raises(InvalidInput, match="--only"):
        GenerateRequest(EPISODE, only="1" * 10_001)


def test_the_dedup_options_are_checked_together() -> None:
    with pytest.raises(InvalidInput, match="do not combine"):
        GenerateRequest(EPISODE, idempotency_key="k", allow_duplicate=True)
    with pytest.raises(InvalidInput, match="invalid batch id"):
        GenerateRequest(EPISODE, batch_id="bad batch")


def test_the_deployment_schema_takes_six_decimals() -> None:
    """The schema a deployment's runs are validated against (server side, the UI's form)."""
    import re

    from prefect.utilities.callables import parameter_schema

    from episodic.flows.generate import generate_episode

    schema = parameter_schema(generate_episode).model_dump()
    max_cost = schema["properties"]["max_cost"]
    pattern = next(option["pattern"] for option in max_cost["anyOf"] if "pattern" in option)
    assert re.fullmatch(pattern, "0.003") and not re.fullmatch(pattern, "0.0000001")


def test_the_python_api_keeps_the_request_rules(tmp_path: Path) -> None:
    """`generate` with run options given outright (a Python caller's) is refused as the CLI
    and the flow refuse them, before any episode is looked up."""
    from episodic.core.planning import RunOptions
    from episodic.core.settings import load_settings
    from episodic.pipeline.gate import EnvironmentCredentials
    from episodic.pipeline.generation import generate
    from episodic.storage.engine import make_engine

    engine = make_engine(f"sqlite:///{tmp_path / 'e.db'}")
    for wrong, words in (
        (RunOptions(concurrency=0), "--concurrency 0"),
        (RunOptions(max_retries=-1), "--max-retries -1"),
        (RunOptions(max_cost_micros=-5), "invalid amount .-0.000005."),
        (RunOptions(max_images=-2), "--max-images -2"),
    ):
        with pytest.raises(InvalidInput, match=words):
            generate(
                engine, load_settings(), "weekly", "2026-W32-0", wrong, EnvironmentCredentials()
            )


@pytest.mark.parametrize("separator", ["\x1c", "\x1d", "\x1e", "\x1f"])
def test_a_separator_around_an_amount_is_refused_as_the_flow_refuses_it(separator: str) -> None:
    with pytest.raises(InvalidInput):
        parse_money(f"2.5{separator}")


def test_the_flow_takes_the_collect_timeout_and_force_resubmit_as_the_cli_does() -> None:
    taken = flow_params(collect_timeout=1, force_resubmit=True)
    assert taken["collect_timeout"] == 1 and taken["force_resubmit"] is True
    assert flow_params(collect_timeout=86_400)["collect_timeout"] == 86_400
    for wrong in ({"collect_timeout": 0}, {"collect_timeout": 86_401}, {"force_resubmit": "yes"}):
        with pytest.raises(ParameterTypeError):
            flow_params(**wrong)
