"""item keys scoped by pipeline: re-key the items of pipelines other than `weekly`

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-29

Item keys now include the pipeline (`core.playlist.scoped_item_id`), except for the pipeline
`weekly`, whose keys keep their old form. Items already recorded for other pipelines are
re-keyed from their episodes' recorded plans, so a later `generate` recognises them (nothing
is paid again). Submissions keep their client references: reconciliation uses what was sent.
"""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def _mapping(conn: Any, episode: Any, *, forward: bool) -> dict[str, str]:
    from episodic.core.errors import InvalidInput
    from episodic.core.playlist import Playlist, expand

    mapping: dict[str, str] = {}
    plans = conn.execute(
        sa.text("SELECT playlist, reference_sha256 FROM episode_plans WHERE episode_pk = :pk"),
        {"pk": episode.id},
    ).all()
    for plan in plans:
        raw = plan.playlist if isinstance(plan.playlist, dict) else json.loads(plan.playlist)
        refs = plan.reference_sha256
        refs = refs if isinstance(refs, list) else json.loads(refs)
        try:
            playlist = Playlist.model_validate(raw)
            old = expand(playlist, refs, episode.episode_id, "weekly")
            new = expand(playlist, refs, episode.episode_id, episode.pipeline)
        except (ValueError, InvalidInput):  # a plan today's rules refuse: its items stay
            continue
        for before, after in zip(old, new, strict=True):
            source, target = (before, after) if forward else (after, before)
            mapping[source.idempotency_key] = target.idempotency_key
    return mapping


def _rekey(*, forward: bool) -> None:
    conn = op.get_bind()
    episodes = conn.execute(
        sa.text("SELECT id, pipeline, episode_id FROM episodes WHERE pipeline <> 'weekly'")
    ).all()
    for episode in episodes:
        for source, target in _mapping(conn, episode, forward=forward).items():
            conn.execute(
                sa.text(
                    "UPDATE items SET idempotency_key = :target "
                    "WHERE idempotency_key = :source AND episode_pk = :pk"
                ),
                {"source": source, "target": target, "pk": episode.id},
            )


def upgrade() -> None:
    _rekey(forward=True)


def downgrade() -> None:
    _rekey(forward=False)
