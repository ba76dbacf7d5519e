"""episodic: Prefect 3 orchestration for recurring, paid work that never pays twice.

The one import package of the distribution. Its subpackages (`episodic.core`,
`episodic.storage`, `episodic.providers`, `episodic.pipeline`, `episodic.tasks`,
`episodic.flows`, `episodic.deployments`, `episodic.cli`) live at the top of the repository,
in the layout of a Prefect project (`flows/`, `tasks/`, ...). In a checkout this folder links
to each of them (``episodic/core -> ../core``), so an editable install, mypy and the tests
import them as the wheel installs them; the wheel's build maps each folder into the package
(``[tool.hatch.build.targets.wheel.sources]`` in pyproject.toml) and ships the example
playlist and its reference files as ``episodic/examples``.

Nothing is imported here: the console script's signal handlers go in before any import
(`episodic.cli.entry`)."""
