"""What the fake provider made, read from its own log, and the faults a test gives it.

The fake provider (`episodic.providers.fake`) appends one JSON line per event to the file
``EPISODIC_FAKE_PROVIDER_LOG`` names: ``submit`` for every create call that arrived,
``job_created`` once per job it really made (and billed), ``collect``, ``lookup``, ... This is
the provider's side of the money: a test counts jobs here, never in episodic's own tables.

Faults are prompt markers the fake reads (its docstring lists them all). `with_faults` writes
a copy of a playlist whose named videos carry one each, so a test rehearses a bad week with
the team's own playlist.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

# The fake's markers, by what they rehearse (`episodic.providers.fake`).
LOST_REPLY = "[[LOSE_RESPONSE]]"
"""The job is made and billed, then the reply is lost: the outcome is unknown, and the next
run settles it by looking the job up, never by paying again."""
REFUSED = "[[FAIL_PERMANENT]]"
"""The provider refuses the call: no job, nothing billed; the item fails."""
FAILED_REMOTELY = "[[FAIL_REMOTE]]"
"""The job is made, then fails at the provider (billed for its compute time)."""


def unavailable(times: int) -> str:
    """The first `times` calls of the item fail as a provider outage would (no job made),
    then one succeeds: retried within the run."""
    if not 1 <= times <= 1000:
        raise ValueError(f"times must be 1 to 1000, not {times}")
    return f"[[FAIL_TRANSIENT:{times}]]"


def slow(ms: int) -> str:
    """Each job of the item takes `ms` milliseconds at the provider."""
    if not 0 <= ms <= 600_000:
        raise ValueError(f"ms must be 0 to 600000, not {ms}")
    return f"[[DELAY_MS:{ms}]]"


class FakeJobs:
    """The fake provider's log at `log` (a JSON-lines file; missing: nothing happened)."""

    def __init__(self, log: Path) -> None:
        self.log = log

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        """Every event in order (each a dict with at least ``event``), or those of `kind`."""
        if not self.log.exists():
            return []
        found = [json.loads(line) for line in self.log.read_text().splitlines() if line]
        return [e for e in found if kind is None or e.get("event") == kind]

    def jobs_per_item(self, episode_id: str | None = None) -> dict[str, int]:
        """Jobs the provider made (and billed), per item: ``{"v01.p1": 1, ...}`` (a video's
        id and part; a hero candidate ``v01.hero.c2``), of `episode_id` or of every episode."""
        made = Counter(
            str(e["item_id"])
            for e in self.events("job_created")
            if episode_id is None or e.get("episode_id") == episode_id
        )
        return dict(sorted(made.items()))

    def jobs(self, episode_id: str | None = None) -> int:
        """How many jobs the provider made in all (of `episode_id`)."""
        return sum(self.jobs_per_item(episode_id).values())

    def calls(self, episode_id: str | None = None) -> int:
        """How many create calls reached the provider, made or refused (of `episode_id`)."""
        return sum(
            1
            for e in self.events("submit")
            if episode_id is None or e.get("episode_id") == episode_id
        )

    def billed_micros(self, episode_id: str | None = None) -> int:
        """What the provider billed for the jobs it made, in micro-units of its currency."""
        return sum(
            int(e.get("cost_micros") or 0)
            for e in self.events("job_created")
            if episode_id is None or e.get("episode_id") == episode_id
        )


def with_faults(playlist: Path, faults: dict[str, str], out: Path) -> Path:
    """A copy of `playlist` at `out` in which each video named in `faults` (by its
    ``video_id``) carries its marker (`LOST_REPLY`, `unavailable(2)`, ...) at the end of its
    title, where the template's ``{title}`` puts it into the prompt the fake reads. The
    playlist's reference assets are copied beside the copy (a playlist's assets resolve
    inside its own folder).

    Raises ValueError when the template has no ``{title}``, or a video is not in the
    playlist."""
    data = yaml.safe_load(playlist.read_text())
    template = (data.get("template") or {}).get("prompt", "")
    if "{title}" not in template:
        raise ValueError(
            f"{playlist}: the template's prompt has no {{title}}, so a fault in a title "
            "would never reach the provider"
        )
    videos = {str(v.get("video_id")): v for v in data.get("items") or []}
    unknown = sorted(set(faults) - set(videos))
    if unknown:
        raise ValueError(f"{playlist}: no video {', '.join(unknown)}")
    for video_id, marker in faults.items():
        videos[video_id]["title"] = f"{videos[video_id]['title']} {marker}"
    base = playlist.resolve().parent
    out.parent.mkdir(parents=True, exist_ok=True)
    for asset in data.get("reference_assets") or []:
        target = out.parent / asset
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(base / asset, target)
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out
