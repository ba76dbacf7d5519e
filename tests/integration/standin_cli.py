"""The `episodic` command against the Replicate and fal stand-ins, as a user runs it (the
installed command in a subprocess), in the state folder of the `home` fixture (the
integration conftest): the profiles' fields on each stand-in, and an episode planned on one."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.acceptance.conftest import EPISODIC
from tests.generation import write_playlist
from tests.standins import FalStandIn, ReplicateStandIn
from tests.standins import fal as fal_standin
from tests.standins import replicate as replicate_standin

PER_IMAGE = '{per_image: "0.003"}'  # Replicate's official models, per output image
# fal flux/dev, billed by started megapixel at 0.025; the profile states one megapixel at most
WHOLE_MEGAPIXELS = '{per_megapixel: "0.025", whole_megapixels: true, at_most: "1"}'


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    assert EPISODIC is not None
    return subprocess.run(
        [EPISODIC, *args], capture_output=True, text=True, timeout=240, env=os.environ.copy()
    )


def replicate_profile(
    server: ReplicateStandIn,
    price: str = PER_IMAGE,
    *,
    outputs: int = 1,
    max_concurrency: int | None = None,
) -> str:
    """A profile's fields (indented by 4) on the stand-in's official model, its key in
    ``REPLICATE_KEY``, asking for `outputs` images a call."""
    return (
        f"    kind: replicate\n    model: {replicate_standin.OFFICIAL_MODEL}\n"
        f"    base_url: {server.base_url}\n    credential_env: REPLICATE_KEY\n"
        f"    price: {price}\n    inputs: {{num_outputs: {outputs}}}\n"
        "    timeout_s: 5.0\n    poll_interval_s: 0.02\n"
        + ("" if max_concurrency is None else f"    max_concurrency: {max_concurrency}\n")
    )


def fal_profile(server: FalStandIn, inputs: str) -> str:
    """A profile's fields (indented by 4) on the stand-in's flux/dev, priced
    `WHOLE_MEGAPIXELS`, its key in ``FAL_KEY``, with the constant `inputs` (YAML)."""
    return (
        f"    kind: fal\n    model: {fal_standin.MODEL}\n"
        f"    base_url: {server.base_url}\n    schema_url: {server.schema_url}\n"
        f"    credential_env: FAL_KEY\n    price: {WHOLE_MEGAPIXELS}\n    inputs: {inputs}\n"
        "    timeout_s: 5.0\n    poll_interval_s: 0.02\n"
    )


def planned(folder: Path, profile: str, titles: list[str]) -> str:
    """The episode allocated (key ``k1``, 2026-W32) and planned with `titles` from the one
    profile ``paid`` whose `profile` fields (indented by 4) the providers file in `folder`
    (the `home` fixture's) holds."""
    (folder / "providers.yaml").write_text("profiles:\n  paid:\n" + profile)
    allocated = cli("allocate", "--key", "k1", "--week", "2026-W32", "--json")
    assert allocated.returncode == 0, allocated
    episode = str(json.loads(allocated.stdout)["episode_id"])
    playlist = write_playlist(folder / "pl", titles, profile="paid")
    assert cli("plan", episode, "--playlist", str(playlist)).returncode == 0
    return episode
