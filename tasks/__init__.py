"""Prefect tasks: thin wrappers over `pipeline` and `storage`."""

from episodic.tasks import _prefect_env

_prefect_env.configure()
