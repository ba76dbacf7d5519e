"""Approval in the Prefect layer: the form a person answers (`form`), waiting for the answer
on a suspended flow run (`wait`) and resuming a run from a decision taken elsewhere
(`resume`). The flow that drives them is `episodic.flows.review` (a deployment entrypoint)."""
