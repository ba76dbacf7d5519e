"""Writes examples/legacy/: two weeks in the legacy weekly layout (docs/legacy-layout.md)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from episodic.providers.fake import render_png

ROOT = Path(__file__).resolve().parent / "legacy"


def week(name: str, videos: int, approval: dict[str, object], completed: str) -> None:
    folder = ROOT / name
    (folder / "images").mkdir(parents=True, exist_ok=True)
    images = []
    for n in range(1, videos + 1):
        content = render_png(f"legacy {name} video {n}", n)
        file = f"images/v{n:02d}.png"
        (folder / file).write_bytes(content)
        images.append(
            {
                "video_id": f"v{n:02d}",
                "part": 1,
                "file": file,
                "sha256": hashlib.sha256(content).hexdigest(),
                "remote_ref": f"pred_{name.lower().replace('-', '')}_{n:02d}",
                "cost_minor": 5,
                "currency": "USD",
                "completed_at": completed,
            }
        )
    cover = render_png(f"legacy {name} cover", 0)
    (folder / "cover.png").write_bytes(cover)
    state = {
        "schema": 1,
        "week_id": name,
        "completed_at": completed,
        "approval": approval,
        "images": images,
        "media": {"cover": {"file": "cover.png", "sha256": hashlib.sha256(cover).hexdigest()}},
    }
    (folder / "state.json").write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    week(
        "2026-W30",
        3,
        {"state": "approved", "by": "ann", "at": "2026-07-21T10:00:00Z", "note": "ok"},
        "2026-07-20T09:30:00Z",
    )
    week("2026-W31", 2, {"state": "pending"}, "2026-07-27T09:30:00Z")
