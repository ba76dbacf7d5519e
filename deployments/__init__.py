"""How the flows are deployed: `prefect.yaml` (work pools) and a local `serve` entry."""

import episodic.tasks  # noqa: F401  (Prefect defaults before Prefect is imported)
