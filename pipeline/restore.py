"""`episodic media restore`: a completed image that the media store lost comes back from
the provider's recorded job, at no cost.

For each completed image of the episode, in playlist order:

- **present**: the store holds its key with the recorded size and sha256; nothing is done.
- **imported**: a row from before the store whose legacy file is still on this machine
  with the recorded sha256: the file is proven an image and put in the store (free).
- otherwise the succeeded paid call's job is *collected again* (`Provider.collect` on its
  remote ref: a download, never a new job), proven an image, and its sha256 compared with
  the recorded one. Equal: written to the store (replacing damaged bytes under the key),
  verified, and the row records the key: **restored**. Not equal: **differs**, refused:
  the recorded sha256 is the evidence of what was paid for, and it is never rewritten
  (nothing is stored or changed for that item). Not an image: **not_an_image**, refused.
- the provider no longer serves it (expired, deleted, 404/410: `RemoteJobFailed`, or not
  collected within the deadline: `CollectionPending`), or no job is recorded:
  **not_served**, with the provider's reason. Buying it again is not done here.
- the store failed on that item's write: **store_failed** (nothing recorded).

The order is the execution gate's: the episode must exist (exit 5) before the store is
probed (exit 2, one line) and before any provider credential is read; credentials are read
only when some image needs its provider, and for the profiles of those images only.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Literal, overload

from sqlalchemy import Engine

from episodic.core.errors import MediaStoreError, NotAnImage
from episodic.core.media import ProvenImage
from episodic.core.settings import Settings
from episodic.pipeline.gate import CredentialSource, GatePass, build_provider, open_gate
from episodic.pipeline.media import prove_image
from episodic.pipeline.media_view import writable_store
from episodic.providers.base import CollectionPending, Provider, RemoteJobFailed, Stopped
from episodic.providers.profiles import configured_profiles, get_profile
from episodic.storage.media import MediaStore
from episodic.storage.media_records import MediaRecords, RecordedImage

Status = Literal[
    "present", "imported", "restored", "differs", "not_an_image", "not_served", "store_failed"
]
GOOD: frozenset[str] = frozenset({"present", "imported", "restored"})
DEFAULT_COLLECT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class ItemRestore:
    """What happened to one completed image (`Status`, the module docstring), its store key
    when it is in the store, a one-line detail, and what its paid call cost (``cost_micros``
    in micro-units of ``currency``: what buying it again would cost at the same price)."""

    item_id: str
    status: Status
    key: str | None
    detail: str = ""
    cost_micros: int = 0
    currency: str = "USD"


@dataclass
class RestoreReport:
    """``items`` in playlist order; ``collected``: provider downloads made (each free: a
    recorded job, never a new one); ``paid_calls`` is always 0."""

    episode_id: str
    store: str
    items: list[ItemRestore] = field(default_factory=list)
    collected: int = 0
    paid_calls: int = 0
    item_pks: list[int] = field(default_factory=list)  # of `items`, in step (not shown)

    @property
    def complete(self) -> bool:
        """Every completed image is in the store now."""
        return all(item.status in GOOD for item in self.items)

    def counts(self) -> dict[str, int]:
        found: dict[str, int] = {}
        for item in self.items:
            found[item.status] = found.get(item.status, 0) + 1
        return found

    def not_served_cost(self) -> dict[str, int]:
        """What the images the provider no longer serves cost when they were bought, per
        currency (minor units): the price of buying them again, which restore never does."""
        cost: dict[str, int] = {}
        for item in self.items:
            if item.status == "not_served":
                cost[item.currency] = cost.get(item.currency, 0) + item.cost_micros
        return cost

    def to_dict(self) -> dict[str, object]:
        return {
            "episode_id": self.episode_id,
            "store": self.store,
            "complete": self.complete,
            "counts": self.counts(),
            "collected": self.collected,
            "paid_calls": self.paid_calls,
            "not_served_cost_micros": self.not_served_cost(),
            "items": [asdict(item) for item in self.items],
        }


OnItem = Callable[[ItemRestore], None]
OnPlan = Callable[[int], None]


def restore(
    engine: Engine,
    settings: Settings,
    pipeline: str,
    episode_id: str,
    credentials: CredentialSource,
    *,
    collect_timeout_s: float = DEFAULT_COLLECT_TIMEOUT_S,
    stop: threading.Event | None = None,
    on_plan: OnPlan | None = None,
    on_item: OnItem | None = None,
) -> RestoreReport:
    """Bring every completed image of the episode back into the media store without paying
    (module docstring). `on_plan(n)`: n images to look at; `on_item` after each.

    Errors before anything is written: `InvalidInput` (a malformed id, exit 2),
    `EpisodeNotFound` (5), `MediaStoreMisconfigured` / `CommandNotAllowed` (the store
    cannot be written, 2). `ProviderConfigError` (a profile or credential, 2) comes after
    the free part (images put back from this machine's legacy files stay put back) and
    before any provider call. An interrupt (`stop`) raises `Stopped` after the item in
    hand."""
    gate = open_gate(engine, pipeline, episode_id, "restore")
    store = writable_store(settings, engine)
    records = MediaRecords(engine)
    images = records.images(gate.episode_pk)
    report = RestoreReport(gate.episode_id, store.describe())
    if on_plan is not None:
        on_plan(len(images))
    stop = stop or threading.Event()
    # in playlist order (an earlier plan's image of the same video and part is listed too:
    # it was paid for, and going back to that plan finds it)
    found: list[ItemRestore | None] = [None] * len(images)
    for n, image in enumerate(images):  # free: the store and this machine's legacy files
        free = found[n] = _priced(_without_provider(store, records, image), image)
        if free is not None and on_item is not None:
            on_item(free)
    pending = [n for n, done in enumerate(found) if done is None]
    providers = _providers(gate, settings, credentials, [images[n] for n in pending])
    try:
        for n in pending:
            if stop.is_set():
                raise Stopped()
            done, downloads = _from_provider(
                store, records, providers, images[n], collect_timeout_s, stop
            )
            report.collected += downloads
            found[n] = done = _priced(done, image=images[n])
            if on_item is not None:
                on_item(done)
    finally:
        for provider in providers.values():
            provider.close()
    report.items = [done for done in found if done is not None]
    report.item_pks = [images[n].item_pk for n, done in enumerate(found) if done is not None]
    return report


@overload
def _priced(done: ItemRestore, image: RecordedImage) -> ItemRestore: ...
@overload
def _priced(done: None, image: RecordedImage) -> None: ...
def _priced(done: ItemRestore | None, image: RecordedImage) -> ItemRestore | None:
    """`done` with what `image`'s paid call cost (None stays None: not decided yet)."""
    if done is None:
        return None
    return replace(done, cost_micros=image.cost_micros, currency=image.currency)


def _without_provider(
    store: MediaStore, records: MediaRecords, image: RecordedImage
) -> ItemRestore | None:
    """present or imported, or None: the provider is needed."""
    if image.key is not None and image.size is not None:
        try:
            if store.verify(image.key, image.sha256, image.size) is None:
                return ItemRestore(image.item_id, "present", image.key)
        except MediaStoreError as exc:
            return ItemRestore(image.item_id, "store_failed", image.key, str(exc))
    if image.legacy_path is None:
        return None
    proven = _legacy_image(Path(image.legacy_path), image.sha256)
    if proven is None:
        return None
    try:
        stored = store.put_image(proven, repair=True)
    except MediaStoreError as exc:
        return ItemRestore(image.item_id, "store_failed", None, str(exc))
    records.record_image(image.item_pk, stored)
    return ItemRestore(image.item_id, "imported", stored.key, f"from {image.legacy_path}")


def _legacy_image(path: Path, sha256: str) -> ProvenImage | None:
    try:
        proven = prove_image(path.read_bytes())
    except (OSError, NotAnImage):
        return None
    return proven if proven.sha256 == sha256 else None


def _providers(
    gate: GatePass, settings: Settings, credentials: CredentialSource, images: list[RecordedImage]
) -> dict[str, Provider]:
    """One client per provider profile the images' jobs were made with (credentials read
    here, through the gate, and only for those)."""
    needed = sorted({image.provider_profile for image in images if image.remote_ref})
    if not needed:
        return {}
    profiles = configured_profiles(settings)
    built: dict[str, Provider] = {}
    try:
        for name in needed:
            built[name] = build_provider(gate, get_profile(profiles, name), credentials, settings)
    except BaseException:
        for provider in built.values():
            provider.close()
        raise
    return built


def _from_provider(
    store: MediaStore,
    records: MediaRecords,
    providers: dict[str, Provider],
    image: RecordedImage,
    timeout_s: float,
    stop: threading.Event,
) -> tuple[ItemRestore, int]:
    """Collect the recorded job again (free), prove, compare, store, record; with the
    number of downloads made (0 or 1)."""
    label = image.item_id
    if image.remote_ref is None:
        return ItemRestore(label, "not_served", image.key, "no provider job is recorded"), 0
    job = image.remote_ref[:80]
    try:
        result = providers[image.provider_profile].collect(
            image.remote_ref, deadline_s=timeout_s, should_stop=stop.is_set
        )
    except (RemoteJobFailed, CollectionPending) as exc:
        why = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        return ItemRestore(label, "not_served", image.key, f"job {job}: {why}"), 0
    try:
        proven = prove_image(result.content)
    except NotAnImage as exc:
        return ItemRestore(label, "not_an_image", image.key, f"job {job}: {exc.reason}"), 1
    if proven.sha256 != image.sha256:
        detail = (
            f"job {job} now serves other bytes (sha256 {proven.sha256[:12]}…, recorded "
            f"{image.sha256[:12]}…): not stored, the recorded image stands"
        )
        return ItemRestore(label, "differs", image.key, detail), 1
    try:
        stored = store.put_image(proven, repair=True)  # same sha256: damaged bytes go
    except MediaStoreError as exc:
        return ItemRestore(label, "store_failed", image.key, str(exc)), 1
    records.record_image(image.item_pk, stored)
    return ItemRestore(label, "restored", stored.key, f"collected again from job {job}"), 1
