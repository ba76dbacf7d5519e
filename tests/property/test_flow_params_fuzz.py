"""Bad flow parameters: every parameter of every flow, fuzzed with malformed ids,
keys, numbers (NaN, inf, huge, negative, non-ASCII digits, bools, floats, numeric strings),
NUL bytes and control characters, 10 KB strings and markup.

Part one checks the boundary as Prefect runs it for a deployment run
(`Flow.validate_parameters`, no server needed): a bad value is refused with Prefect's
`ParameterTypeError` naming the parameter (never echoing a 10 KB input), and what is accepted
has exactly the declared type (an int is an int, not `True`; a flag is a bool, not "yes") and
no control characters where text is stored or used as a path.

Part two runs flows in the Prefect test harness with values the schema accepts but the
domain refuses (a week 53 in a 52-week year, an episode that does not exist, a bad
selection, a playlist path that is a folder): the run fails with a one-line message, before
any row is written and before any provider client is built (no credential read).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from prefect.exceptions import ParameterTypeError, SignatureMismatchError
from sqlalchemy import Engine, create_engine, func, select

from episodic.flows.generate import generate_episode
from episodic.flows.maintenance import cancel_stale
from episodic.flows.plan import plan_episode_flow
from episodic.flows.review import approve_episode, assemble_episode
from episodic.flows.weekly import weekly_episode
from tests.flows.conftest import prefect_harness  # noqa: F401 (the session's Prefect harness)

FLOWS = {
    "generate": generate_episode,
    "plan": plan_episode_flow,
    "approve": approve_episode,
    "assemble": assemble_episode,
    "weekly": weekly_episode,
    "sweep": cancel_stale,
}
# The smallest valid parameters of each flow; one of them is replaced by a nasty value.
BASE: dict[str, dict[str, Any]] = {
    "generate": {"episode_id": "2026-W32-0"},
    "plan": {"episode_id": "2026-W32-0", "playlist": "playlist.yaml"},
    "approve": {"episode_id": "2026-W32-0"},
    "assemble": {"episode_id": "2026-W32-0"},
    "weekly": {"week": "2026-W32", "allocation_key": "k"},
    "sweep": {},
}
INTS = {"concurrency", "max_retries", "max_images", "timeout_s", "approval_timeout_s"}
FLAGS = {"allow_duplicate", "generate", "wait_for_approval", "dry_run"}
NO_CONTROL = {"playlist", "allocation_key", "idempotency_key", "episode_id", "week", "pipeline"}
CONTROL = {chr(c) for c in [*range(0x20), *range(0x7F, 0xA0)]}

NASTY: list[Any] = [
    None,
    "",
    " ",
    "x" * 10_000,
    "a\x00b",
    "k\nk",
    "\x1b[31m",
    "[bold red]boom[/]",
    "../../etc/passwd",
    "/etc/passwd",
    "\u0661\u0662",
    "\uff11",
    "2026-W32-0\n",
    "2026-W53-0",
    "2026-W32--1",
    "\u0662\u0660\u0662\u0666-W32-0",
    "2026-W32-00",
    "nan",
    "4",
    "yes",
    "true",
    float("nan"),
    float("inf"),
    -1,
    0,
    1.5,
    4.0,
    10**30,
    2**63,
    True,
    False,
    [],
    {},
    ["2026-W32-0"],
]
VALUE = st.sampled_from(NASTY) | st.text(max_size=30) | st.integers()


def parameters(name: str) -> list[str]:
    return list(FLOWS[name].parameters.properties)


CASES = [(flow, parameter) for flow in FLOWS for parameter in parameters(flow)]


@settings(max_examples=400, deadline=None, derandomize=True)
@given(case=st.sampled_from(CASES), value=VALUE)
@example(case=("generate", "concurrency"), value=True)  # found: taken as 1
@example(case=("generate", "max_images"), value=4.0)  # found: taken as 4
@example(case=("generate", "allow_duplicate"), value="yes")  # found: taken as True
@example(case=("weekly", "generate"), value="1")  # found: taken as True
@example(case=("weekly", "playlist"), value="a\x00b")  # found: read after allocating
@example(case=("weekly", "allocation_key"), value="k\x00")  # found: refused after a write
@example(case=("plan", "playlist"), value="\x1b[31mx")
@example(case=("approve", "approval_timeout_s"), value=1e300)
@example(case=("approve", "timeout_s"), value=1e300)
@example(case=("generate", "episode_id"), value="x" * 10_000)
def test_a_flow_parameter_is_refused_at_the_boundary_or_is_what_it_declares(
    case: tuple[str, str], value: Any
) -> None:
    name, parameter = case
    flow = FLOWS[name]
    try:
        accepted = flow.validate_parameters({**BASE[name], parameter: value})
    except ParameterTypeError as exc:
        message = str(exc)
        assert parameter in message and "Traceback (most recent call last)" not in message
        assert all(len(line) < 300 for line in message.splitlines()), message[:500]
        return
    except SignatureMismatchError:  # not a parameter of this flow
        raise AssertionError((name, parameter)) from None
    got = accepted[parameter]
    if got is None:
        return
    if parameter in INTS:
        assert type(got) is int, (name, parameter, value)
    if parameter in FLAGS:
        assert type(got) is bool, (name, parameter, value)
    if isinstance(got, str):
        assert len(got) <= 1024, (name, parameter)
        if parameter in NO_CONTROL:
            assert not CONTROL & set(got), (name, parameter, got)


def test_unknown_parameters_are_refused() -> None:
    for name, flow in FLOWS.items():
        with pytest.raises(SignatureMismatchError):
            flow.validate_parameters({**BASE[name], "extra": 1})


# --- part two: in the harness -------------------------------------------------------------

TABLES = ("episodes", "episode_events", "episode_plans", "runs", "items", "submissions")


def counts(url: str) -> dict[str, int]:
    from sqlalchemy import table

    engine: Engine = create_engine(url)
    with engine.connect() as conn:
        found = {
            name: conn.execute(select(func.count()).select_from(table(name))).scalar_one()
            for name in TABLES
        }
    engine.dispose()
    return found


@pytest.fixture
def planned(
    request: pytest.FixtureRequest,
    database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> str:
    """2026-W32-0 allocated and planned (two videos) in a fresh database of each backend, in
    the Prefect harness; the fake provider logs to a file."""
    request.getfixturevalue("prefect_harness")
    url = database_url
    from episodic.core.ids import WeekId
    from episodic.pipeline.allocation import allocate
    from episodic.pipeline.episode_plan import record_plan
    from episodic.storage.engine import make_engine
    from tests.generation import write_playlist

    monkeypatch.setenv("EPISODIC_FAKE_PROVIDER_LOG", str(tmp_path / "provider.jsonl"))
    engine = make_engine(url)
    allocate(engine, "weekly", WeekId.parse("2026-W32"), "fuzz")
    record_plan(engine, "weekly", "2026-W32-0", write_playlist(tmp_path / "pl", ["a", "b"]))
    engine.dispose()
    (tmp_path / "folder.yaml").mkdir()
    return url


REFUSED_IN_THE_DOMAIN = [
    ("generate", {"episode_id": "2027-W53-0"}, "ISO weeks"),
    ("generate", {"episode_id": "2026-W32-7"}, "not found"),
    ("generate", {"episode_id": "2026-W32-0", "only": "9"}, "videos 1-2"),
    ("generate", {"episode_id": "2026-W32-0", "batch_id": "a\x00b"}, "batch"),
    ("plan", {"episode_id": "2026-W32-0", "playlist": "folder.yaml"}, "regular file"),
    ("weekly", {"week": "2027-W53", "allocation_key": "k"}, "ISO weeks"),
    ("weekly", {"week": "2026-W32", "allocation_key": " k"}, "whitespace"),
    ("weekly", {"week": "2026-W32", "allocation_key": "k\u202e"}, "control"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "params", "needle"), REFUSED_IN_THE_DOMAIN)
def test_a_value_the_domain_refuses_fails_the_run_in_one_line_before_any_write(
    planned: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    params: dict[str, Any],
    needle: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    before = counts(planned)
    flow = FLOWS[name].with_options(retries=0)  # the weekly flow retries once, 10 s later
    state = flow(**params, return_state=True)
    message = state.message or ""
    assert state.is_failed(), (name, params, state)
    assert needle in message, message
    assert "Traceback (most recent call last)" not in message and "\n" not in message.strip(), (
        message
    )
    assert counts(planned) == before
    log = tmp_path / "provider.jsonl"
    events = (
        [json.loads(line)["event"] for line in log.read_text().splitlines()] if log.exists() else []
    )
    assert "client_built" not in events  # no provider client, so no credential was read
