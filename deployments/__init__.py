"""How the flows are deployed: `prefect.yaml` (work pools) and a local `serve` entry."""

import tasks  # noqa: F401  (Prefect defaults before Prefect is imported)
