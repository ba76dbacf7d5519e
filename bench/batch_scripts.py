"""The measuring scripts of bench/batch.py, each run in a fresh process (`str.format`
templates): the sleeping floor, the same-work floor and the `generate_episode` flow. Each
prints its makespan, the CPU time its process spent meanwhile, and its body's time: from the
call until the flow's work was done (the floors: their last result in the flow's body; the
flow: its run's end in the ledger), before Prefect ends the flow run."""

FLOOR = """
import episodic.tasks, time
from prefect import flow, task
from prefect.task_runners import ThreadPoolTaskRunner

HEARTBEATS = {heartbeats}
if not HEARTBEATS:  # see --prefect-heartbeats: the floor and the flow are measured alike
    # (the setting cannot be None from the environment, and Prefect's engine does not read
    # a temporary_settings context here: the engine's property is what it consults)
    import prefect.flow_engine
    prefect.flow_engine.FlowRunEngine.heartbeat_seconds = property(lambda self: None)

GCL = {gcl}

@task
def work(n: int) -> int:
    if GCL:  # the per-item global-concurrency-slot pattern this project no longer uses
        from prefect.concurrency.sync import concurrency
        with concurrency("bench-gcl", occupy=1, strict=True):
            time.sleep({latency_s})
        return n
    time.sleep({latency_s})
    return n

if GCL:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.exceptions import ObjectNotFound
    with get_client(sync_client=True) as client:
        try:
            client.delete_global_concurrency_limit_by_name("bench-gcl")
        except ObjectNotFound:
            pass
        client.create_global_concurrency_limit(
            GlobalConcurrencyLimitCreate(name="bench-gcl", limit={concurrency})
        )

def make(items: int):
    @flow(task_runner=ThreadPoolTaskRunner(max_workers={concurrency}))
    def floor() -> int:
        futures = [work.submit(n) for n in range(items)]
        done = len([f.result() for f in futures])
        BODY.append(time.perf_counter())
        return done
    return floor

BODY = []  # when each run's body had its last result
make(1)()  # warm-up: the ephemeral server starts outside the measurement
time.sleep({settle_s})  # see FLOW: both sides start measuring with the server settled
t, cpu = time.perf_counter(), time.process_time()
make({items})()
print(time.perf_counter() - t, time.process_time() - cpu, BODY[-1] - t)
"""

FLOW = """
import episodic.tasks, time
from prefect import flow
from episodic.flows.generate import generate_episode

HEARTBEATS = {heartbeats}
if not HEARTBEATS:  # see --prefect-heartbeats: the floor and the flow are measured alike
    # (the setting cannot be None from the environment, and Prefect's engine does not read
    # a temporary_settings context here: the engine's property is what it consults)
    import prefect.flow_engine
    prefect.flow_engine.FlowRunEngine.heartbeat_seconds = property(lambda self: None)

from prefect import task

@task
def nothing() -> None:
    pass

@flow
def warm() -> None:
    nothing.submit().result()

warm()  # warm-up, the same as the floor's (one flow run of one task): the ephemeral server
# starts, and Prefect's task engine is imported and used once, outside the measurement.
# Then a pause: the ephemeral server records the warm-up's events in its SQLite database a
# moment later, and a flow run created meanwhile is answered 503 ("database is locked")
# and retried by Prefect's client after 2 s: three runs in four
# measured that 2 s. Both sides wait the same.
time.sleep({settle_s})
started, t, cpu = time.time(), time.perf_counter(), time.process_time()
generate_episode(episode_id="{episode}", concurrency={concurrency})
wall, cpu = time.perf_counter() - t, time.process_time() - cpu
import os
from episodic.storage.engine import make_engine
from episodic.storage.runs import RunStore
(run,) = RunStore(make_engine(os.environ["EPISODIC_DATABASE_URL"])).list_runs("weekly")
print(wall, cpu, run.finished_at.timestamp() - started)
"""

SAME_WORK = """
import episodic.tasks, time
from pathlib import Path
from prefect import flow, task
from prefect.cache_policies import INPUTS
from prefect.task_runners import ThreadPoolTaskRunner
from episodic.pipeline.media import prove_image
from episodic.providers.base import ImageRequest
from episodic.core.pricing import Price
from episodic.providers.fake import FakeProvider
from episodic.storage.media import MediaStore

HEARTBEATS = {heartbeats}
if not HEARTBEATS:  # as in the sleeping floor (see --prefect-heartbeats)
    import prefect.flow_engine
    prefect.flow_engine.FlowRunEngine.heartbeat_seconds = property(lambda self: None)

WORK = Path({work!r})
PROVIDER = FakeProvider(  # the fake's simulated server side: job files, the PNG render
    profile_id="bench", state_dir=WORK / "fake-provider", price=Price("per_image", 10_000, "USD", 1),
    max_concurrency=64, delay_ms={latency_ms},
)
STORE = MediaStore.open(str(WORK / "media"), create=True)  # a local folder, as the flow's

@task(cache_policy=INPUTS, persist_result=True, result_storage=WORK / "results")
def work(run: str, n: int) -> str:  # Prefect's own result caching: no ledger, no claims
    request = ImageRequest(f"{{run}}-{{n}}", "2026-W32-0", f"v{{n:03d}}",
                           f"cover for video {{n}} part 1", 100 + n)
    remote = PROVIDER.submit(request)
    result = PROVIDER.collect(remote, deadline_s=600, should_stop=lambda: False)
    return STORE.put_image(prove_image(result.content)).key

def make(run: str, items: int):
    @flow(task_runner=ThreadPoolTaskRunner(max_workers={concurrency}))
    def same_work() -> int:
        futures = [work.submit(run, n) for n in range(items)]
        done = len([f.result() for f in futures])
        BODY.append(time.perf_counter())
        return done
    return same_work

BODY = []  # as in the sleeping floor
make("warm", 1)()  # warm-up, as the other sides'
time.sleep({settle_s})
t, cpu = time.perf_counter(), time.process_time()
make("measured", {items})()
print(time.perf_counter() - t, time.process_time() - cpu, BODY[-1] - t)
"""
