"""`episodic dispatch` and the Prefect bucket of the sweep, against the test harness.

The harness is shared by the whole session, so each test works in its own pipeline (the
pipeline is part of every fingerprint) and asserts only about its own flow runs.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prefect.client.orchestration import get_client
from prefect.states import Completed, Scheduled
from sqlalchemy import Engine

from episodic.core.errors import EpisodeNotFound, IdempotencyKeyReused
from episodic.core.ids import WeekId
from episodic.core.settings import load_settings
from episodic.flows.dispatch import dispatch
from episodic.flows.generate import generate_episode
from episodic.flows.maintenance import cancel_stale, cancel_stuck_flow_runs
from episodic.flows.review import assemble_episode
from episodic.pipeline.allocation import allocate
from episodic.storage.engine import make_engine

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def deployments(prefect_harness: None) -> dict[str, uuid.UUID]:
    ids = {}
    for name, flow_ in (("generate", generate_episode), ("assemble", assemble_episode)):
        deployment = flow_.to_deployment(name=name)
        ids[name] = deployment.apply()  # type: ignore[union-attr]
    return ids  # type: ignore[return-value]


@pytest.fixture
def db(harness: str) -> Iterator[Engine]:
    engine = make_engine(harness)
    yield engine
    engine.dispose()


@pytest.fixture
def pipeline() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def episode(db: Engine, pipeline: str) -> str:
    return str(allocate(db, pipeline, WeekId.parse("2026-W32"), "k").episode.episode_id)


def _dispatch(db: Engine, pipeline: str, command: str, episode: str, **kw: object):  # type: ignore[no-untyped-def]
    return dispatch(db, load_settings(), pipeline, command, episode, **kw)  # type: ignore[arg-type]


def test_a_duplicate_dispatch_returns_the_same_flow_run(
    deployments: dict[str, uuid.UUID], db: Engine, pipeline: str, episode: str
) -> None:
    first = _dispatch(db, pipeline, "generate", episode)
    assert not first.deduplicated and first.state == "Scheduled"
    again = _dispatch(db, pipeline, "generate", episode)
    assert again.deduplicated and again.flow_run_id == first.flow_run_id
    other = _dispatch(db, pipeline, "assemble", episode)  # another command: another request
    assert not other.deduplicated and other.flow_run_id != first.flow_run_id
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(uuid.UUID(first.flow_run_id))
    assert run.parameters == {"episode_id": episode, "pipeline": pipeline}
    assert run.idempotency_key == first.prefect_idempotency_key


def test_concurrent_dispatches_make_one_flow_run(
    deployments: dict[str, uuid.UUID], db: Engine, pipeline: str, episode: str
) -> None:
    barrier = threading.Barrier(10)
    answers: list[object] = []

    def go() -> None:
        barrier.wait()
        answers.append(_dispatch(db, pipeline, "generate", episode))

    threads = [threading.Thread(target=go) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(answers) == 10
    assert len({a.flow_run_id for a in answers}) == 1  # type: ignore[attr-defined]
    assert sum(1 for a in answers if not a.deduplicated) == 1  # type: ignore[attr-defined]


def test_a_finished_flow_run_is_not_reused_and_opt_outs_make_new_ones(
    deployments: dict[str, uuid.UUID], db: Engine, pipeline: str, episode: str
) -> None:
    first = _dispatch(db, pipeline, "generate", episode)
    parallel = _dispatch(db, pipeline, "generate", episode, allow_duplicate=True)
    assert not parallel.deduplicated and parallel.flow_run_id != first.flow_run_id
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(uuid.UUID(first.flow_run_id), Completed(), force=True)
        client.set_flow_run_state(uuid.UUID(parallel.flow_run_id), Completed(), force=True)
    later = _dispatch(db, pipeline, "generate", episode)
    assert not later.deduplicated and later.flow_run_id not in {
        first.flow_run_id,
        parallel.flow_run_id,
    }
    assert later.prefect_idempotency_key != first.prefect_idempotency_key


def test_an_explicit_key_for_another_request_is_refused(
    deployments: dict[str, uuid.UUID], db: Engine, pipeline: str, episode: str
) -> None:
    first = _dispatch(db, pipeline, "generate", episode, idempotency_key="hook-42")
    again = _dispatch(db, pipeline, "generate", episode, idempotency_key="hook-42")
    assert again.deduplicated and again.flow_run_id == first.flow_run_id
    with pytest.raises(IdempotencyKeyReused, match=first.flow_run_id):
        _dispatch(db, pipeline, "assemble", episode, idempotency_key="hook-42")
    with get_client(sync_client=True) as client:  # the key reaches the flow run's parameters
        run = client.read_flow_run(uuid.UUID(first.flow_run_id))
    assert run.parameters["idempotency_key"] == "hook-42"


def test_dispatch_of_a_missing_episode_is_refused_before_prefect(
    deployments: dict[str, uuid.UUID], db: Engine, pipeline: str
) -> None:
    with pytest.raises(EpisodeNotFound):
        _dispatch(db, pipeline, "generate", "2026-W32-7")


def test_a_stuck_scheduled_run_past_the_ttl_is_cancelled(
    deployments: dict[str, uuid.UUID], harness: str, tmp_path: Path
) -> None:
    long_ago = datetime.now(UTC) - timedelta(hours=2)
    soon = datetime.now(UTC) + timedelta(hours=2)
    with get_client(sync_client=True) as client:
        stuck = client.create_flow_run_from_deployment(
            deployments["generate"],
            parameters={"episode_id": "2026-W32-0"},
            state=Scheduled(scheduled_time=long_ago),
        )
        future = client.create_flow_run_from_deployment(
            deployments["generate"],
            parameters={"episode_id": "2026-W32-0"},
            state=Scheduled(scheduled_time=soon),
        )
    assert str(stuck.id) in cancel_stuck_flow_runs(900, dry_run=True)
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(stuck.id).state.type.value == "SCHEDULED"  # type: ignore[union-attr]
    result = cancel_stale()  # the maintenance flow: every bucket, the Prefect one included
    assert str(stuck.id) in result["buckets"]["stuck_flow_runs"]["ids"]
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(stuck.id).state.type.value == "CANCELLED"  # type: ignore[union-attr]
        assert client.read_flow_run(future.id).state.type.value == "SCHEDULED"  # type: ignore[union-attr]
    assert str(stuck.id) not in cancel_stuck_flow_runs(900)  # a second sweep: nothing to do


def test_the_dispatch_command_dedups_and_says_so(
    deployments: dict[str, uuid.UUID], harness: str, pipeline: str, episode: str
) -> None:
    """`episodic dispatch` as a script runs it, against the harness's API server."""
    import json
    import os
    import subprocess

    from prefect.settings import PREFECT_API_URL

    from tests.acceptance.conftest import EPISODIC

    assert EPISODIC is not None
    env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value())}
    args = [EPISODIC, "dispatch", "generate", episode, "--pipeline", pipeline]

    def run(*extra: str, environ: dict[str, str] = env) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*args, *extra], capture_output=True, text=True, env=environ, timeout=120
        )

    first, second = run("--json"), run("--json")
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    a, b = json.loads(first.stdout), json.loads(second.stdout)
    assert a["flow_run_id"] == b["flow_run_id"] and [a["deduplicated"], b["deduplicated"]] == [
        False,
        True,
    ]
    text = run()
    assert text.returncode == 0 and text.stdout.startswith("deduplicated: flow run")
    no_server = {k: v for k, v in env.items() if k != "PREFECT_API_URL"}
    refused = run(environ=no_server)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "error: dispatch needs a Prefect server: set PREFECT_API_URL "
        "(e.g. http://127.0.0.1:4200/api)"
    ]
    missing = subprocess.run(
        [EPISODIC, "dispatch", "generate", "2026-W40-3", "--pipeline", pipeline],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert missing.returncode == 5, missing.stderr
