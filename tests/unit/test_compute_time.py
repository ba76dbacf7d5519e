"""The compute time an adapter reads from a reply (`providers.jobs_api.compute_us_of`): what a
per_second price is charged on, so only a finite, non-negative number of seconds is believed,
read exactly from its decimal digits (Replicate's old cassettes carry negative figures)."""

from __future__ import annotations

from typing import Any

import pytest

from episodic.core.pricing import MAX_QUANTITY
from episodic.providers.jobs_api import compute_us_of


@pytest.mark.parametrize(
    ("metrics", "field", "micros"),
    [
        ({"predict_time": 2.803618}, "predict_time", 2_803_618),  # replicate-python cassette
        ({"predict_time": 0.012683}, "predict_time", 12_683),  # Replicate's docs example
        ({"predict_time": 3}, "predict_time", 3_000_000),
        ({"predict_time": 0}, "predict_time", 0),
        ({"predict_time": 1.0000001}, "predict_time", 1_000_001),  # rounded up, never down
        ({"inference_time": 1.2249955059960485}, "inference_time", 1_224_996),  # fal
        ({"predict_time": -11136021.178237}, "predict_time", None),  # found in cassettes
        ({"predict_time": float("nan")}, "predict_time", None),
        ({"predict_time": float("inf")}, "predict_time", None),
        ({"predict_time": True}, "predict_time", None),
        ({"predict_time": "2.5"}, "predict_time", None),
        ({"predict_time": None}, "predict_time", None),
        ({"predict_time": 10**7}, "predict_time", None),  # 10^13 us: beyond MAX_QUANTITY
        ({"inference_time": None}, "inference_time", None),  # fal-js: number | null
        ({}, "inference_time", None),  # legacy fal apps send no metrics
        ({"predict_time": 2.5}, "inference_time", None),  # another API's field
    ],
)
def test_a_compute_time_is_believed_only_when_finite_and_in_range(
    metrics: dict[str, Any], field: str, micros: int | None
) -> None:
    assert compute_us_of({"metrics": metrics}, field) == micros


@pytest.mark.parametrize("job", [{}, {"metrics": None}, {"metrics": [1.5]}, {"metrics": 2.5}])
def test_a_reply_without_a_metrics_object_reports_no_compute_time(job: dict[str, Any]) -> None:
    assert compute_us_of(job) is None and compute_us_of(job, "inference_time") is None


def test_the_largest_believed_time_is_the_quantity_limit() -> None:
    assert compute_us_of({"metrics": {"predict_time": MAX_QUANTITY // 10**6}}) == MAX_QUANTITY
