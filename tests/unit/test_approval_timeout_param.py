"""The approval timeout has one name on every flow that waits for a decision; a deployment
that sets the approve flow's `timeout_s` is still read."""

from __future__ import annotations

import pytest
from prefect.exceptions import ParameterTypeError


def test_both_waiting_flows_take_approval_timeout_s_with_one_range() -> None:
    from episodic.flows.review import approve_episode
    from episodic.flows.weekly import weekly_episode

    weekly = {"week": "2026-W32", "allocation_key": "k"}
    approve = {"episode_id": "2026-W32-0"}
    for flow, base in ((weekly_episode, weekly), (approve_episode, approve)):
        assert flow.validate_parameters(base)["approval_timeout_s"] == 7 * 86_400
        assert (
            flow.validate_parameters({**base, "approval_timeout_s": 60})["approval_timeout_s"] == 60
        )
        for wrong in (59, 90 * 86_400 + 1, True):
            with pytest.raises(ParameterTypeError):
                flow.validate_parameters({**base, "approval_timeout_s": wrong})


def test_the_approve_flow_still_reads_timeout_s() -> None:
    from episodic.flows.review import approve_episode

    params = approve_episode.validate_parameters({"episode_id": "2026-W32-0", "timeout_s": 120})
    assert params["timeout_s"] == 120
    with pytest.raises(ParameterTypeError):
        approve_episode.validate_parameters({"episode_id": "2026-W32-0", "timeout_s": 30})
