"""ORM rows. They never leave `storage`: repositories turn them into `core` domain objects."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from episodic.core.episodes import Episode, EpisodeEvent
from episodic.core.ids import EpisodeId, WeekId
from episodic.core.states import OPEN_SUBMISSION_STATES, state_check_sql, states_in_sql
from episodic.storage.base import Base, utcnow

# BigInteger primary keys that still autoincrement on SQLite (where only INTEGER does).
BigIntPK = BigInteger().with_variant(Integer(), "sqlite")


def machine_check(machine: str) -> CheckConstraint:
    """The table's `state` column holds exactly `machine`'s states (`core.states`):
    ``ck_<table>_state_known``, on both backends."""
    return CheckConstraint(state_check_sql(machine), name="state_known")


# An item has at most one paid call in flight: one open submission (intent, accepted,
# unknown). A claim inserts an intent only when none is open; a forced resubmit closes the
# open one failed first; a re-buy (a job cancelled elsewhere, a lost image) follows a
# submission that is closed (failed, or succeeded with its cost); each hero candidate is an
# item of its own. So the index holds in every path, and a broken guard is refused here.
OPEN_PER_ITEM_SQL = states_in_sql(OPEN_SUBMISSION_STATES)


class EpisodeRow(Base):
    __tablename__ = "episodes"
    __table_args__ = (
        UniqueConstraint("pipeline", "episode_id"),
        UniqueConstraint("pipeline", "allocation_key"),
        UniqueConstraint("pipeline", "week_id", "sequence"),
        machine_check("episode"),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    pipeline: Mapped[str] = mapped_column(String(63))
    week_id: Mapped[str] = mapped_column(String(8))
    sequence: Mapped[int] = mapped_column(Integer)
    episode_id: Mapped[str] = mapped_column(String(24))
    allocation_key: Mapped[str] = mapped_column(String(512))
    state: Mapped[str] = mapped_column(String(32), default="allocated")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)

    events: Mapped[list[EpisodeEventRow]] = relationship(
        back_populates="episode", order_by="EpisodeEventRow.id"
    )

    def to_domain(self) -> Episode:
        return Episode(
            pipeline=self.pipeline,
            episode_id=EpisodeId(WeekId.parse(self.week_id), self.sequence),
            allocation_key=self.allocation_key,
            state=self.state,
            created_at=self.created_at,
        )


class EpisodeEventRow(Base):
    """Append-only history of an episode."""

    __tablename__ = "episode_events"
    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    episode_pk: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("episodes.id", ondelete="RESTRICT"), index=True
    )
    kind: Mapped[str] = mapped_column(String(32))
    at: Mapped[datetime] = mapped_column(default=utcnow)
    detail: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)

    episode: Mapped[EpisodeRow] = relationship(back_populates="events")

    def to_domain(self) -> EpisodeEvent:
        return EpisodeEvent(kind=self.kind, at=self.at, detail=dict(self.detail or {}))


class EpisodePlanRow(Base):
    """The playlist an episode generates from (`episodic plan`), as recorded, newest wins."""

    __tablename__ = "episode_plans"

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    episode_pk: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("episodes.id", ondelete="RESTRICT"), index=True
    )
    playlist: Mapped[dict[str, Any]] = mapped_column(JSON)
    playlist_sha256: Mapped[str] = mapped_column(String(64))
    reference_sha256: Mapped[list[str]] = mapped_column(JSON)
    source_path: Mapped[str | None] = mapped_column(String(1024))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ReferenceImageRow(Base):
    """A plan's reference image, content-addressed: what was planned is what is sent, from any
    machine that reaches the database (the playlist's file may change or be elsewhere)."""

    __tablename__ = "reference_images"

    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    media_type: Mapped[str] = mapped_column(String(32))
    content: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class RunRow(Base):
    __tablename__ = "runs"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    episode_pk: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("episodes.id", ondelete="RESTRICT"), index=True
    )
    command: Mapped[str] = mapped_column(String(32))
    state: Mapped[str] = mapped_column(String(16), index=True)
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    # Dispatch dedup: the request's fingerprint (explicit key or a digest of
    # pipeline, episode, command and canonical parameters) and the digest of its parameters.
    fingerprint: Mapped[str | None] = mapped_column(String(64))
    request_sha256: Mapped[str | None] = mapped_column(String(64))
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    batch_id: Mapped[str | None] = mapped_column(String(64))
    # The recorded plan (episode_plans.id) the run was admitted for: a re-planned episode's
    # older runs pay for nothing more (NULL: admitted before runs recorded it, not checked).
    plan_id: Mapped[int | None] = mapped_column(BigInteger)
    error_text: Mapped[str | None] = mapped_column(String(2000))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column()
    heartbeat_at: Mapped[datetime | None] = mapped_column()
    # Liveness: every process working on the run pushes this forward; expired = nobody is.
    lease_expires_at: Mapped[datetime | None] = mapped_column()
    finished_at: Mapped[datetime | None] = mapped_column()

    __table_args__ = (
        Index("ix_runs_fingerprint_created_at", "fingerprint", "created_at"),
        Index("ix_runs_state_created_at", "state", "created_at"),
        machine_check("run"),
    )


class ItemRow(Base):
    """One paid image of an episode, identified by its idempotency key across runs."""

    __tablename__ = "items"

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    episode_pk: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("episodes.id", ondelete="RESTRICT"), index=True
    )
    run_id: Mapped[str | None] = mapped_column(
        String(36), ForeignKey("runs.id", ondelete="RESTRICT"), index=True
    )
    idempotency_key: Mapped[str] = mapped_column(String(32), unique=True)
    position: Mapped[int] = mapped_column(Integer)
    video_id: Mapped[str] = mapped_column(String(64))
    part: Mapped[int] = mapped_column(Integer)  # 0 for a hero candidate
    candidate: Mapped[int | None] = mapped_column(Integer)  # 1..N: a hero candidate
    prompt: Mapped[str] = mapped_column(String(8000))
    seed: Mapped[int] = mapped_column(BigInteger)
    state: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    error_text: Mapped[str | None] = mapped_column(String(2000))
    # The image as the media store keeps it: a store-relative content key, never a machine
    # path, with its sha256 (hex), size (bytes) and media type (proven from the bytes).
    output_key: Mapped[str | None] = mapped_column(String(1024))
    output_sha256: Mapped[str | None] = mapped_column(String(64))
    output_size: Mapped[int | None] = mapped_column(BigInteger)
    output_media_type: Mapped[str | None] = mapped_column(String(64))
    # The absolute path of an image written before the media store (legacy rows only).
    output_path: Mapped[str | None] = mapped_column(String(1024))
    force_resubmit: Mapped[bool] = mapped_column(default=False)
    # The claim: only the holder may submit; liveness is "lease not expired".
    claim_owner: Mapped[str | None] = mapped_column(String(64), index=True)
    claim_run_id: Mapped[str | None] = mapped_column(String(36))
    # The provider profile a running item holds a slot of (the cross-process provider limit:
    # running items with a live lease, per profile; a dead holder's slot frees with its lease).
    claim_profile: Mapped[str | None] = mapped_column(String(64))
    # A claim is worked once: an item task (on a Dask worker, another machine) consumes this
    # token when it starts, so a re-executed task can never send the same paid call again.
    claim_token: Mapped[str | None] = mapped_column(String(32))
    lease_expires_at: Mapped[datetime | None] = mapped_column()
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column()
    finished_at: Mapped[datetime | None] = mapped_column()

    __table_args__ = (
        Index("ix_items_state_lease", "state", "lease_expires_at"),
        Index("ix_items_claim_profile_state", "claim_profile", "state"),
        machine_check("item"),
    )


class RunItemRow(Base):
    """Which items a run was asked to finish. Items are shared: two runs of one episode may
    both include an item; whoever holds its claim does the paid work, the other follows."""

    __tablename__ = "run_items"

    run_id: Mapped[str] = mapped_column(
        String(36), ForeignKey("runs.id", ondelete="RESTRICT"), primary_key=True
    )
    item_pk: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("items.id", ondelete="RESTRICT"), primary_key=True, index=True
    )


class SubmissionRow(Base):
    """The ledger of paid calls: intent before the call, then the remote ref and the outcome."""

    __tablename__ = "submissions"
    # One job of the provider belongs to one submission: a lookup that answers with another
    # item's job can never be recorded (nor its cost counted) twice.
    # Open submissions of a profile are counted as provider slots (storage.claims).
    __table_args__ = (
        UniqueConstraint("provider_profile", "remote_ref"),
        Index("ix_submissions_profile_state_created", "provider_profile", "state", "created_at"),
        Index("ix_submissions_run", "run_id"),  # a run's spend (the caps, in the claim)
        Index("ix_submissions_created", "created_at"),  # a period's spend (the budgets)
        machine_check("submission"),
        Index(
            "uq_submissions_one_open_per_item",
            "item_pk",
            unique=True,
            sqlite_where=text(OPEN_PER_ITEM_SQL),
            postgresql_where=text(OPEN_PER_ITEM_SQL),
        ),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    item_pk: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("items.id", ondelete="RESTRICT"), index=True
    )
    run_id: Mapped[str] = mapped_column(String(36), ForeignKey("runs.id", ondelete="RESTRICT"))
    attempt: Mapped[int] = mapped_column(Integer)
    client_reference: Mapped[str] = mapped_column(String(64), unique=True)
    provider_profile: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16))
    remote_ref: Mapped[str | None] = mapped_column(String(256))
    forced: Mapped[bool] = mapped_column(default=False)
    error_text: Mapped[str | None] = mapped_column(String(2000))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    accepted_at: Mapped[datetime | None] = mapped_column()
    finished_at: Mapped[datetime | None] = mapped_column()
    # what the call was reserved at when its intent was committed (the price's estimate,
    # micro-units of `currency`): counted by the caps and budgets until it settles
    reserved_micros: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    currency: Mapped[str | None] = mapped_column(String(3))


class CostEntryRow(Base):
    """What one paid call cost (micro-units of `currency`), with the basis it was charged
    on, the measured quantity and the unit price it follows from (`episodic.core.pricing`)."""

    __tablename__ = "cost_entries"
    __table_args__ = (
        CheckConstraint(
            "basis IN ('per_image', 'per_megapixel', 'per_whole_megapixel', 'per_second', "
            "'reported')",
            name="basis_known",
        ),
        CheckConstraint(
            "amount_micros >= 0 AND quantity >= 0 AND unit_price_micros >= 0",
            name="amounts_not_negative",
        ),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    episode_pk: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("episodes.id", ondelete="RESTRICT"), index=True
    )
    submission_pk: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("submissions.id", ondelete="RESTRICT"), unique=True
    )
    amount_micros: Mapped[int] = mapped_column(BigInteger)
    currency: Mapped[str] = mapped_column(String(3))
    basis: Mapped[str] = mapped_column(String(24))
    quantity: Mapped[int] = mapped_column(BigInteger)
    unit_price_micros: Mapped[int] = mapped_column(BigInteger)
    recorded_at: Mapped[datetime] = mapped_column(default=utcnow)


class ApprovalRow(Base):
    """A person's decision on a generated episode (append-only)."""

    __tablename__ = "approvals"

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    episode_pk: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("episodes.id", ondelete="RESTRICT"), index=True
    )
    decision: Mapped[str] = mapped_column(String(16))
    decided_by: Mapped[str] = mapped_column(String(100))
    note: Mapped[str | None] = mapped_column(String(2000))
    decided_at: Mapped[datetime] = mapped_column(default=utcnow)


class EpisodeMediaRow(Base):
    """Final media of an episode (cover, manifest) with the sha256 recorded at assembly."""

    __tablename__ = "episode_media"
    __table_args__ = (UniqueConstraint("episode_pk", "kind"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    episode_pk: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("episodes.id", ondelete="RESTRICT")
    )
    kind: Mapped[str] = mapped_column(String(32))
    key: Mapped[str | None] = mapped_column(String(1024))  # in the media store
    sha256: Mapped[str] = mapped_column(String(64))
    size: Mapped[int | None] = mapped_column(BigInteger)  # bytes
    media_type: Mapped[str | None] = mapped_column(String(64))
    path: Mapped[str | None] = mapped_column(String(1024))  # legacy rows: absolute path
    recorded_at: Mapped[datetime] = mapped_column(default=utcnow)


class LostOutputRow(Base):
    """A completed item's image the media store lost and its provider no longer served,
    recorded when `media restore --buy-again` sends the item back to pending: which paid
    call's output (`submission_pk`, which stays succeeded with its cost: the money was
    spent), which key and sha256 were lost, when, and why."""

    __tablename__ = "lost_outputs"

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    item_pk: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("items.id", ondelete="RESTRICT"), index=True
    )
    submission_pk: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("submissions.id", ondelete="RESTRICT"), unique=True
    )
    key: Mapped[str | None] = mapped_column(String(1024))
    sha256: Mapped[str] = mapped_column(String(64))
    size: Mapped[int | None] = mapped_column(BigInteger)
    media_type: Mapped[str | None] = mapped_column(String(64))
    reason: Mapped[str] = mapped_column(String(2000))
    lost_at: Mapped[datetime] = mapped_column(default=utcnow)


class PipelineRow(Base):
    """A pipeline's settings that every process must agree on (its timezone decides weeks).

    Recorded on first use from EPISODIC_TIMEZONE (UTC when unset) and changed only by
    `episodic pipelines set-timezone`.
    """

    __tablename__ = "pipelines"

    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    timezone: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class PipelineBudgetRow(Base):
    """A pipeline's budget for one period kind (``week`` or ``month``, in the pipeline's
    timezone): no item is claimed whose reservation would take the period's spend over
    `amount_micros` (`episodic.storage.budgets`). Set by `episodic pipelines set-budget`."""

    __tablename__ = "pipeline_budgets"
    __table_args__ = (
        CheckConstraint("period IN ('week', 'month')", name="period"),
        CheckConstraint("amount_micros >= 0", name="amount"),
    )

    pipeline: Mapped[str] = mapped_column(
        String(63), ForeignKey("pipelines.name", ondelete="RESTRICT"), primary_key=True
    )
    period: Mapped[str] = mapped_column(String(8), primary_key=True)
    amount_micros: Mapped[int] = mapped_column(BigInteger)
    currency: Mapped[str] = mapped_column(String(3))
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class InstallationRow(Base):
    """This database's identity (one row, made by migration 0012): every client reference
    and Idempotency-Key sent to a provider starts with `id`, so installations sharing a
    provider account never meet each other's jobs (storage.installation)."""

    __tablename__ = "installation"
    __table_args__ = (CheckConstraint("singleton = 1", name="one_row"),)

    singleton: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    id: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class MediaStoreRow(Base):
    """The media store this database records its paid media in (at most one row, made by
    the first command that writes media): `store_id` is the uuid of the store's marker
    object, `url` its public URL (storage.store_identity)."""

    __tablename__ = "media_store"
    __table_args__ = (CheckConstraint("singleton = 1", name="one_row"),)

    singleton: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    store_id: Mapped[str] = mapped_column(String(36))
    url: Mapped[str] = mapped_column(String(2000))
    recorded_at: Mapped[datetime] = mapped_column(default=utcnow)


class ProviderThrottleRow(Base):
    """A provider profile the provider refused for now (429, or 503 with ``Retry-After``):
    no new paid call of it is claimed before `not_before` (`episodic.storage.throttles`,
    `episodic.storage.claims`); `detail` is the provider's own words."""

    __tablename__ = "provider_throttles"

    profile: Mapped[str] = mapped_column(String(64), primary_key=True)
    not_before: Mapped[datetime]
    detail: Mapped[str] = mapped_column(String(500))
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
