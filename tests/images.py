"""Test builders for image records: an `EpisodeImage` of a video's part (or hero candidate)
with placeholder store fields, for code that lays images out or names them."""

from __future__ import annotations

from episodic.core.records import EpisodeImage


def episode_image(video: str, part: int, candidate: int | None = None) -> EpisodeImage:
    """The image of `video`'s `part` (hero `candidate` when given): no stored bytes, sha256
    of zeros, free."""
    return EpisodeImage(
        idempotency_key=f"k-{video}-{part}-{candidate}",
        video_id=video,
        part=part,
        candidate=candidate,
        position=1,
        key=None,
        sha256="0" * 64,
        size=None,
        media_type="image/png",
        legacy_path=None,
        remote_ref=None,
        cost_micros=0,
        currency="USD",
    )
