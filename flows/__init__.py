"""Prefect flows. Importing `tasks` first applies this project's Prefect defaults."""

import episodic.tasks  # noqa: F401  (must run before the first `import prefect`)
