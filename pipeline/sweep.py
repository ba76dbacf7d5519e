"""`episodic sweep` and the `cancel_stale` flow's database part. No Prefect."""

from __future__ import annotations

from sqlalchemy import Engine

from episodic.core.settings import Settings
from episodic.pipeline.admission import dedup_policy
from episodic.storage.sweep import BUCKETS, Sweeper, SweepReport

__all__ = ["BUCKETS", "BUCKET_MEANING", "SweepReport", "sweep"]

BUCKET_MEANING = {
    "expired_runs": "running → failed: run lease expired (process gone); resumable",
    "expired_items": "running → failed: claim lease expired; a resume continues the item",
    "stale_pending_runs": "pending → cancelled: never started within the pending TTL",
    "orphaned_items": "pending → cancelled: every run that included them was cancelled",
}


def sweep(engine: Engine, settings: Settings, *, dry_run: bool = False) -> SweepReport:
    """Reap what no live process holds: expired leases (EPISODIC_LEASE_S), runs pending
    longer than EPISODIC_PENDING_TTL_S, orphaned items of cancelled runs. Safe to run at any
    time and concurrently; never touches completed work or a submission."""
    return Sweeper(engine).sweep(dedup_policy(settings), dry_run=dry_run)
