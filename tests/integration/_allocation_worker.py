"""A separate OS process that allocates a list of keys (used by the concurrency test)."""

from __future__ import annotations

import json
import sys

from episodic.core.ids import WeekId
from episodic.pipeline.allocation import allocate
from episodic.storage.engine import make_engine


def main() -> None:
    url, week, keys_json = sys.argv[1], sys.argv[2], sys.argv[3]
    engine = make_engine(url)
    sys.stdin.readline()  # start together: wait for the parent's go
    results = []
    for key in json.loads(keys_json):
        allocation = allocate(engine, "weekly", WeekId.parse(week), key)
        results.append([key, str(allocation.episode.episode_id), allocation.created])
    print(json.dumps(results))


if __name__ == "__main__":
    main()
