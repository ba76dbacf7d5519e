"""A deterministic, inspectable fake image provider for tests and the demo.

Images are PNGs drawn from the prompt and seed (Pillow), so the same request gives the same
bytes. The fake honours idempotent create and lookup (``idempotent_create=True``,
``can_lookup=True``): a submit whose client reference already has a job returns that job's
remote reference (event ``submit_replayed``) and creates nothing. Prompt markers inject
behaviour:

- ``[[DELAY_MS:n]]``: the job takes n ms (default: the profile's ``delay_ms``, else
  ``EPISODIC_FAKE_DELAY_MS``, else 0); a job not ready by the collect deadline raises
  ``CollectionPending``;
- ``[[FAIL_TRANSIENT]]``: every submit fails transiently; ``[[FAIL_TRANSIENT:n]]``: the first n
  submits of that client reference fail, then it succeeds (no job is created before that);
- ``[[FAIL_PERMANENT]]``: submit is refused permanently (no job is created);
- ``[[NO_LOOKUP]]``: a lookup never finds the job; with ``[[LOSE_RESPONSE]]`` every reply to
  its create is lost too, so nothing can settle the outcome but an operator;
- ``[[LOSE_RESPONSE]]``: the job is created, then the reply is lost (``UnknownOutcome``); sending
  the same call again replays the job;
- ``[[FAIL_REMOTE]]``: the job is created, then fails: collect raises ``RemoteJobFailed``
  (billed, its compute time reported);
- ``[[COMPUTE_MS:n]]``: the job's compute time the fake reports (``compute_us``, as
  Replicate's ``metrics.predict_time``), default 2000 ms;
- ``[[SIZE:n]]``: the picture is n x n pixels (8 to 4096; default 64);
- ``[[OUTPUT:kind]]``: every download of the job answers `kind` instead of its PNG:
  ``html`` (an error page), ``truncated`` (a PNG cut short), ``empty`` (a 200 with no
  body), ``gif``, ``jpeg`` or ``webp``
  (the same picture in that format); ``[[OUTPUT:kind:n]]``: the first n downloads of the job
  in this process do, then the PNG.

Collecting a remote reference the fake's job store does not hold raises ``CollectionPending``
naming the job and the store: "unknown job" proves nothing about a charge (the job may be
in another machine's store, or the store was moved), so it is never read as failed at no
cost and bought again; the submission stays accepted for a later collect or the operator.

Created jobs are kept as files under ``state_dir`` (the fake's "server side"), so a later
process can look a job up by its client reference and collect it. Like a remote provider's,
that store is one for every machine when ``EPISODIC_FAKE_PROVIDER_DIR`` names a shared
folder (an absolute path; `jobs_folder`); unset, it is ``$EPISODIC_HOME/fake-provider``,
this installation's alone. When
``EPISODIC_FAKE_PROVIDER_LOG`` is set, one JSON line per event is appended there: ``submit``
(every create call that arrived), ``job_created`` (once per job really created, with its
client reference, item, episode, remote reference, ``cost_micros``: what the fake bills for
it, computed by the fake itself from its price, its picture's pixels and its compute time,
and the sha256 of the reference image sent, if any) and ``accepted`` (the same moment,
kept for older readers), ``submit_replayed``, ``lookup``, ``collect``, ``cancel`` (a job
still running is cancelled: its collect raises ``RemoteJobFailed`` at no cost) and
``client_built``.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import threading
import time
from decimal import ROUND_CEILING, Decimal
from pathlib import Path
from typing import Any

from episodic.core.errors import ProviderConfigError
from episodic.core.output_files import RecordPaths
from episodic.core.pricing import Price
from episodic.providers.base import (
    CancelsJobs,
    Capabilities,
    CollectionPending,
    ImageRequest,
    ImageResult,
    PermanentProviderError,
    RecordedElsewhere,
    RemoteJobFailed,
    StopCheck,
    Stopped,
    TransientProviderError,
    UnknownOutcome,
)

_DELAY = re.compile(r"\[\[DELAY_MS:([0-9]{1,7})\]\]")
_COMPUTE = re.compile(r"\[\[COMPUTE_MS:([0-9]{1,9})\]\]")
_SIZE = re.compile(r"\[\[SIZE:([0-9]{1,4})\]\]")
DEFAULT_COMPUTE_MS = 2000
_TRANSIENT = re.compile(r"\[\[FAIL_TRANSIENT(?::([0-9]{1,4}))?\]\]")
_OUTPUT = re.compile(r"\[\[OUTPUT:(html|truncated|empty|gif|jpeg|webp)(?::([0-9]{1,4}))?\]\]")
_log_guard = threading.Lock()


def log_event(event: str, **fields: Any) -> None:
    path = os.environ.get("EPISODIC_FAKE_PROVIDER_LOG")
    if not path:
        return
    line = json.dumps({"event": event, "at": time.time(), "pid": os.getpid(), **fields})
    with _log_guard, open(path, "a", encoding="utf-8") as handle:
        handle.write(line + "\n")


def refuse_record(record: RecordPaths) -> None:
    """Raise `InvalidInput` (exit 2, before any job) when ``EPISODIC_FAKE_PROVIDER_LOG`` or
    ``EPISODIC_FAKE_PROVIDER_DIR`` names a part of the installation's `record` (its ledger,
    providers file or media store): the fake appends its events and writes its jobs there,
    and neither may write over what the record is."""
    for name in ("EPISODIC_FAKE_PROVIDER_LOG", "EPISODIC_FAKE_PROVIDER_DIR"):
        raw = os.environ.get(name, "")
        if raw.strip():
            record.refuse(Path(raw), f"{name}={raw[:200]}")


def _compute_us(prompt: str) -> int:
    """The compute time the fake reports for a job of `prompt`, in microseconds."""
    found = _COMPUTE.search(prompt)
    return (int(found[1]) if found else DEFAULT_COMPUTE_MS) * 1000


def _size(prompt: str) -> int:
    """The side of the fake's square picture for `prompt`, in pixels (8 to 4096)."""
    found = _SIZE.search(prompt)
    return min(4096, max(8, int(found[1]))) if found else 64


def render_png(prompt: str, seed: int, size: int = 64) -> bytes:
    """A deterministic picture of (prompt, seed): a colour field with a hashed pattern."""
    from PIL import Image

    digest = hashlib.sha256(f"{seed}\x00{prompt}".encode()).digest()
    tile = Image.frombytes("RGB", (8, 8), (digest * 6)[: 8 * 8 * 3])
    image = Image.new("RGB", (size, size), tuple(digest[:3]))
    image.paste(
        tile.resize((size // 2, size // 2), Image.Resampling.NEAREST), (size // 4, size // 4)
    )
    out = io.BytesIO()
    image.save(out, format="PNG", optimize=False)
    return out.getvalue()


def render_output(kind: str, png: bytes) -> tuple[bytes, str]:
    """The body and the reply's media type a download of kind `kind` (``[[OUTPUT:kind]]``)
    answers instead of `png`: an HTML error page, the PNG cut short, no body, or the same picture
    as a GIF, JPEG or WEBP."""
    from PIL import Image

    if kind == "html":
        return b"<!DOCTYPE html><html><body><h1>502 Bad Gateway</h1></body></html>", "text/html"
    if kind == "truncated":
        return png[: len(png) // 2], "image/png"
    if kind == "empty":
        return b"", "image/png"
    out = io.BytesIO()
    with Image.open(io.BytesIO(png)) as image:
        image.convert("RGB").save(out, format=kind.upper())
    return out.getvalue(), f"image/{kind}"


def _env_delay_ms() -> int:
    """``EPISODIC_FAKE_DELAY_MS``: whole milliseconds, 0 to 600000 (empty or unset: 0).
    Raises `ProviderConfigError` (exit 2) for anything else (``nan``, ``1e3``, ``-5``)."""
    raw = os.environ.get("EPISODIC_FAKE_DELAY_MS", "").strip()
    if not raw:
        return 0
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 6 or int(raw) > 600_000:
        raise ProviderConfigError(
            f"EPISODIC_FAKE_DELAY_MS={raw[:40]!r}: expected whole milliseconds, 0 to 600000"
        )
    return int(raw)


def jobs_folder(home: Path) -> Path:
    """The fake's job store (its "server side"): ``EPISODIC_FAKE_PROVIDER_DIR`` when set (an
    absolute path: a relative one would follow each process's working folder), else
    ``home/fake-provider``. Raises `ProviderConfigError` (exit 2) for a relative value."""
    raw = os.environ.get("EPISODIC_FAKE_PROVIDER_DIR", "")
    if not raw.strip():
        return home / "fake-provider"
    folder = Path(raw)
    if not folder.is_absolute():
        raise ProviderConfigError(
            f"EPISODIC_FAKE_PROVIDER_DIR={raw[:80]!r}: expected an absolute folder path"
        )
    return folder


class FakeProvider(CancelsJobs):
    def __init__(
        self,
        *,
        profile_id: str,
        state_dir: Path,
        price: Price | None = None,
        max_concurrency: int = 8,
        delay_ms: int | None = None,
        credential: str | None = None,
    ) -> None:
        self.profile_id = profile_id
        self.state_dir = state_dir
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if delay_ms is None:
            delay_ms = _env_delay_ms()
        self.delay_ms = delay_ms
        self.capabilities = Capabilities(
            max_concurrency=max_concurrency,
            supports_seed=True,
            price=price or Price("per_image", 40_000, "USD", 1),
            can_lookup=True,
            idempotent_create=True,
        )
        self._transient_seen: dict[str, int] = {}
        self._downloads_seen: dict[str, int] = {}
        self._jobs: dict[str, dict[str, Any]] = {}
        self._guard = threading.Lock()
        self.submissions: list[ImageRequest] = []  # what this client received, for inspection
        log_event("client_built", profile=profile_id, has_credential=credential is not None)

    def submit(self, request: ImageRequest) -> str:
        log_event(
            "submit",
            client_reference=request.client_reference,
            episode_id=request.episode_id,
            item_id=request.item_id,
        )
        with self._guard:
            self.submissions.append(request)
        transient = _TRANSIENT.search(request.prompt)
        if transient:
            with self._guard:
                seen = self._transient_seen.get(request.client_reference, 0) + 1
                self._transient_seen[request.client_reference] = seen
            limit = transient[1]
            if limit is None or seen <= int(limit):
                raise TransientProviderError(f"fake transient failure #{seen}")
        if "[[FAIL_PERMANENT]]" in request.prompt:
            raise PermanentProviderError("fake permanent refusal")
        remote_ref = self._remote_ref(request.client_reference)
        delay = _DELAY.search(request.prompt)
        job = {
            "remote_ref": remote_ref,
            "client_reference": request.client_reference,
            "prompt": request.prompt,
            "seed": request.seed,
            "ready_at": time.time() + (int(delay[1]) if delay else self.delay_ms) / 1000,
        }
        with self._guard:
            created = _create_exclusive(self._job_path(remote_ref), json.dumps(job))
            if created:
                self._jobs[remote_ref] = job
        if not created:  # idempotent create: this client reference already has its job
            log_event(
                "submit_replayed", client_reference=request.client_reference, remote_ref=remote_ref
            )
            if "[[NO_LOOKUP]]" in request.prompt and "[[LOSE_RESPONSE]]" in request.prompt:
                raise UnknownOutcome("fake provider: the reply was lost again")
            return remote_ref
        log_event(
            "job_created",
            client_reference=request.client_reference,
            item_id=request.item_id,
            episode_id=request.episode_id,
            remote_ref=remote_ref,
            cost_micros=self._bill(request.prompt),
            ready_at=job["ready_at"],  # the job runs at the provider until then
            reference_sha256=_data_sha256(request.reference_image),
        )
        log_event("accepted", client_reference=request.client_reference, remote_ref=remote_ref)
        if "[[LOSE_RESPONSE]]" in request.prompt:
            raise UnknownOutcome("fake provider accepted the job, then the reply was lost")
        return remote_ref

    def collect(self, remote_ref: str, *, deadline_s: float, should_stop: StopCheck) -> ImageResult:
        job = self._job(remote_ref)
        if job is None:  # proves nothing about a charge: never failed, never bought again
            raise CollectionPending(
                f"job {remote_ref[:40]!r} is unknown to the fake provider's job store "
                f"{self.state_dir} (another machine's store? set EPISODIC_FAKE_PROVIDER_DIR "
                "to one folder every machine shares)"
            )
        give_up = time.monotonic() + deadline_s
        while (wait := job["ready_at"] - time.time()) > 0:
            if should_stop():
                raise Stopped()
            if time.monotonic() > give_up:
                raise CollectionPending(f"remote task {remote_ref} not ready in time")
            time.sleep(min(wait, 0.05))
        if self._job_path(remote_ref).with_suffix(".canceled").exists():
            raise RemoteJobFailed("fake job canceled", billed=False, cancelled=True)
        log_event("collect", remote_ref=remote_ref)
        if "[[FAIL_REMOTE]]" in job["prompt"]:
            raise RemoteJobFailed("fake remote job failed", compute_us=_compute_us(job["prompt"]))
        content = render_png(job["prompt"], job["seed"], _size(job["prompt"]))
        media_type = "image/png"
        output = _OUTPUT.search(job["prompt"])
        if output is not None:
            with self._guard:
                seen = self._downloads_seen.get(remote_ref, 0) + 1
                self._downloads_seen[remote_ref] = seen
            if output[2] is None or seen <= int(output[2]):
                content, media_type = render_output(output[1], content)
        return ImageResult(content, media_type, compute_us=_compute_us(job["prompt"]))

    def _bill(self, prompt: str) -> int:
        """What the fake charges for a job of `prompt`, in micro-units, by its own
        arithmetic (Decimal, rounded up to a micro-unit), not the engine's: the provider's
        side of the bill. A failed job is billed as it would have been (its compute)."""
        price = self.capabilities.price
        unit = Decimal(price.unit_micros)
        if price.basis == "per_image":
            return price.unit_micros
        if price.basis == "per_second":
            quantity = Decimal(_compute_us(prompt)) / 1_000_000
        else:
            pixels = _size(prompt) ** 2  # the fake's pictures are square
            megapixels = Decimal(pixels) / 1_000_000
            if price.basis == "per_whole_megapixel":
                megapixels = megapixels.to_integral_value(rounding=ROUND_CEILING)
            quantity = megapixels
            if "[[FAIL_REMOTE]]" in prompt:  # no picture: billed at the stated bound
                quantity = Decimal(price.estimate_quantity) / 1_000_000
                if price.basis == "per_whole_megapixel":
                    quantity = quantity.to_integral_value(rounding=ROUND_CEILING)
        return int((unit * quantity).to_integral_value(rounding=ROUND_CEILING))

    def lookup(
        self,
        client_reference: str,
        request: ImageRequest | None = None,
        *,
        recorded: RecordedElsewhere | None = None,
    ) -> str | None:
        log_event("lookup", client_reference=client_reference)
        remote_ref = self._remote_ref(client_reference)
        path = self._job_path(remote_ref)
        if not path.exists() or "[[NO_LOOKUP]]" in json.loads(path.read_text())["prompt"]:
            return None
        return remote_ref

    def cancel(self, remote_ref: str) -> str:
        """Cancel a job that is still running (``canceled``, not billed); a finished one
        answers ``succeeded`` and an unknown one ``not_found``."""
        job = self._job(remote_ref)
        log_event("cancel", remote_ref=remote_ref)
        if job is None:
            return "not_found"
        if job["ready_at"] <= time.time():
            return "succeeded"
        self._job_path(remote_ref).with_suffix(".canceled").touch()
        return "canceled"

    def close(self) -> None:
        pass

    @staticmethod
    def _remote_ref(client_reference: str) -> str:
        return "fake-" + hashlib.sha256(client_reference.encode()).hexdigest()[:20]

    def _job_path(self, remote_ref: str) -> Path:
        return self.state_dir / f"{remote_ref}.json"

    def _job(self, remote_ref: str) -> dict[str, Any] | None:
        """The job of this remote reference, created by this or another client (process)."""
        if not re.fullmatch(r"fake-[0-9a-f]{20}", remote_ref):
            return None
        with self._guard:
            job = self._jobs.get(remote_ref)
        if job is not None:
            return job
        path = self._job_path(remote_ref)
        return json.loads(path.read_text()) if path.exists() else None


def _data_sha256(uri: str | None) -> str | None:
    """The sha256 of a data: URI's bytes (what a reference image sent really was)."""
    if uri is None:
        return None
    _, _, payload = uri.partition(";base64,")
    return hashlib.sha256(base64.b64decode(payload)).hexdigest()


def _create_exclusive(path: Path, text: str) -> bool:
    """Write `text` to `path` unless it exists; atomic across processes (False: it existed)."""
    staging = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    staging.write_text(text, encoding="utf-8")
    try:
        os.link(staging, path)
    except FileExistsError:
        return False
    finally:
        staging.unlink()
    return True
