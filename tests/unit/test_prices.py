"""What a price says before and after buying: the size a profile's inputs ask for raises a
megapixel estimate; whether a failed or cancelled job is billed, per kind and as stated; a
charge above the estimate is named."""

from __future__ import annotations

from pathlib import Path

import pytest

from episodic.core.errors import ProviderConfigError
from episodic.core.pricing import Charge
from episodic.pipeline.prices import above_price, failure_charge
from episodic.providers.base import RemoteJobFailed
from episodic.providers.profiles import Profile, load_profiles

FAL = "    kind: fal\n    model: fal-ai/flux/dev\n    credential_env: KEY\n"
REPLICATE = "    kind: replicate\n    model: owner/name\n    credential_env: KEY\n"


def profile(tmp_path: Path, fields: str) -> Profile:
    path = tmp_path / "providers.yaml"
    path.write_text(f"profiles:\n  p:\n{fields}")
    return load_profiles(path)["p"]


@pytest.mark.parametrize(
    ("inputs", "estimate", "said"),
    [
        ("{image_size: square_hd}", 50_000, "image_size square_hd (1024x1024)"),
        ("{image_size: square}", 25_000, None),  # 512x512: under at_most, which stays
        ("{width: 2000, height: 1000}", 50_000, "inputs width 2000, height 1000"),
        ("{}", 25_000, None),
    ],
)
def test_a_known_size_raises_a_megapixel_estimate(
    tmp_path: Path, inputs: str, estimate: int, said: str | None
) -> None:
    price = '{per_megapixel: "0.025", whole_megapixels: true, at_most: "1"}'
    found = profile(tmp_path, f"{FAL}    price: {price}\n    inputs: {inputs}\n")
    assert found.pricing.estimate_micros == estimate
    text = found.estimate_text(1)
    assert (said in text) if said else ("image_size" not in text and "inputs" not in text)


@pytest.mark.parametrize(
    ("fields", "billed"),
    [
        (f'{REPLICATE}    price: {{per_image: "0.003"}}\n', False),
        (f'{REPLICATE}    price: {{per_megapixel: "0.02", at_most: "1"}}\n', False),
        (f'{REPLICATE}    price: {{per_second: "0.001", at_most: "10"}}\n', True),
        (f'{REPLICATE}    price: {{per_image: "0.003", failed: billed}}\n', True),
        (f'{FAL}    price: {{per_image: "0.003"}}\n', False),
        ('    kind: fake\n    price: {per_image: "0.003"}\n', True),
        ('    kind: fake\n    price: {per_image: "0.003", failed: free}\n', False),
    ],
)
def test_a_price_says_whether_a_failed_job_is_billed(
    tmp_path: Path, fields: str, billed: bool
) -> None:
    found = profile(tmp_path, fields)
    assert found.bills_failures is billed
    charge = failure_charge(found.pricing, found, RemoteJobFailed("failed", compute_us=10**6))
    assert (charge is not None) is billed


def test_a_reported_figure_and_an_unbilled_adapter_answer_win(tmp_path: Path) -> None:
    found = profile(tmp_path, f'{REPLICATE}    price: {{per_image: "0.003"}}\n')
    reported = RemoteJobFailed("failed", reported_micros=7)
    assert failure_charge(found.pricing, found, reported) == Charge.reported(7, "USD")
    second = profile(tmp_path, f'{REPLICATE}    price: {{per_second: "0.001", at_most: "9"}}\n')
    aborted = RemoteJobFailed("aborted", billed=False)
    assert failure_charge(second.pricing, second, aborted) is None


@pytest.mark.parametrize("value", ["billed", "yes", "true", "1"])
def test_failed_is_validated(tmp_path: Path, value: str) -> None:
    fields = f'{FAL}    price: {{per_image: "0.003", failed: {value}}}\n'
    with pytest.raises(ProviderConfigError) as raised:
        profile(tmp_path, fields)
    assert "profile 'p'" in str(raised.value) and "\n" not in str(raised.value)


def test_a_charge_above_the_estimate_is_named_and_one_at_it_is_not(tmp_path: Path) -> None:
    found = profile(tmp_path, f'{REPLICATE}    price: {{per_megapixel: "0.02", at_most: "1"}}\n')
    price = found.pricing
    at = price.charge(1_000_000)
    above = price.charge(2_000_000)
    assert above_price(price, found, "job1", at) is None
    assert above_price(price, found, "job1", None) is None
    why = above_price(price, found, "job1", above)
    assert why is not None and "0.04 USD" in why and "0.02 USD" in why and "'p'" in why
    free = profile(tmp_path, '    kind: fake\n    price: {per_image: "0"}\n    free: true\n')
    assert above_price(free.pricing, free, "j", Charge.reported(5, "USD")) is None
