"""Who is asking: the current flow run, as a `episodic.core.keys.Invocation`.

Read from the flow run context, never from `prefect.runtime.flow_run.scheduled_start_time`
(outside a flow run that silently returns *now*).
"""

from __future__ import annotations

from prefect.client.orchestration import get_client
from prefect.context import FlowRunContext

from episodic.core.keys import Invocation


def current_invocation() -> Invocation | None:
    context = FlowRunContext.get()
    if context is None or context.flow_run is None or context.flow is None:
        return None
    flow_run = context.flow_run
    deployment_name = None
    if flow_run.deployment_id is not None:
        with get_client(sync_client=True) as client:
            deployment_name = client.read_deployment(flow_run.deployment_id).name
    return Invocation(
        flow_name=context.flow.name,
        flow_run_id=str(flow_run.id),
        deployment_name=deployment_name,
        auto_scheduled=bool(flow_run.auto_scheduled),
        # A manual run's expected start is set when it is created and survives retries;
        # `created` is the fallback for runs that never had one.
        expected_start_time=flow_run.expected_start_time or flow_run.created,
    )
