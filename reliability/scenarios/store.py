"""Store faults: the media store frozen, answering 500/503 or slowly, a disk that fills, and
downloads that are not the image, under a running generation."""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import subprocess
import tempfile
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text

from reliability.harness import EPISODIC, Backend, Result, generate_trial, open_engine
from reliability.oracle import episode_of, leftovers

_DOWNLOADS = ["[[DOWNLOAD_HTML:2]]", "[[DOWNLOAD_TRUNCATED:1]]", "[[DOWNLOAD_GIF:2]]", "", "", ""]
_KINDS = ["s3-freeze", "s3-5xx", "s3-slow", "disk-full"]
_ITEMS = 6


def store_faults(backend: Backend, trials: int, rng: random.Random) -> Result:
    """Generations (the local HTTP provider, 6 items, concurrency 2) whose media store fails
    under them: the moto S3 server frozen (SIGSTOP) for 3-5 s and resumed (SIGCONT), a
    fault proxy in front of it answering 500/503 to a random share of requests or delaying
    them, or a local folder store on a small tmpfs that fills (as root); half of the
    items' downloads are an HTML page, a truncated PNG or a GIF for their first tries. A
    run that meets a store failure stops buying (paused); the store is fixed and the one
    recovery command (`generate` again, which resumes the run) runs: one provider job per
    item, every completed image in the store (read there: size and sha256 against the
    ledger), nothing stuck, `check` clean."""
    from tests.fault_proxy import FaultProxy
    from tests.fs_faults import can_mount
    from tests.http_server import TOKEN
    from tests.s3_server import S3Server

    result = Result("store-faults", backend.name)
    root = Path(tempfile.mkdtemp(prefix="episodic-reliability-store-"))
    kinds = _KINDS if can_mount() else _KINDS[:3]
    saved = dict(os.environ)
    os.environ["TEST_IMAGE_TOKEN"] = TOKEN
    s3 = S3Server(root / "s3").start()
    stopped = paid = downloads = 0
    try:
        for trial in range(trials):
            kind = kinds[trial % len(kinds)]
            local = random.Random(rng.randrange(2**32))
            with FaultProxy(s3.endpoint, seed=local.randrange(2**32)) as proxy:
                store = _Store(kind, root / f"store{trial}", s3, proxy, local)
                with store.ready() as media_url:
                    os.environ.update({**s3.env(), "AWS_ENDPOINT_URL": proxy.endpoint})
                    os.environ["EPISODIC_MEDIA_URL"] = media_url
                    # each trial's store is new (a bucket, a tmpfs): so is its database,
                    # which records the store it writes to (`episodic.storage.store_identity`)
                    url = backend.fresh()
                    engine = open_engine(url)
                    made, first, injected = _trial(engine, root, trial, store, local, result)
                    stopped += first != "completed"
                    paid += sum(made.values())
                    downloads += store.downloads
                    _audit(result, engine, url, root, trial, kind, made, store)
                    engine.dispose()
                result.faults.update(injected)
                result.faults.update(
                    {f"store {k}": n for k, n in proxy.counts.items() if k != "forwarded"}
                )
            result.trials += 1
    finally:
        s3.stop()
        os.environ.clear()
        os.environ.update(saved)
    result.paid_jobs, result.logical_items = paid, trials * _ITEMS
    result.notes = (
        f"{_ITEMS} items per trial, the local HTTP provider (3 polls per job), concurrency 2; "
        f"store faults in turn: {', '.join(kinds)}; {stopped} of {result.trials} first runs "
        "stopped buying at a store failure (paused) and were finished by the recovery "
        "command; faults counted at the store's side (the proxy's answers, freezes, disk "
        f"fills); the provider served {downloads} downloads for {paid} jobs (an output that "
        "is not an image is downloaded again, free)"
    )
    return result


class _Store:
    """The trial's store and its fault: `ready()` gives its URL, `inject()` runs the fault
    (in a thread, at a random moment), `fix()` ends it, `read(key)` reads an object around
    the store's code (for the audit)."""

    def __init__(self, kind: str, folder: Path, s3: Any, proxy: Any, rng: random.Random):
        self.kind, self.folder, self.s3, self.proxy, self.rng = kind, folder, s3, proxy, rng
        self.bucket = ""
        self.done = threading.Event()
        self.injected: Counter[str] = Counter()
        self.downloads = 0  # of the trial's outputs, at the provider (its own count)

    @contextlib.contextmanager
    def ready(self) -> Iterator[str]:
        if self.kind != "disk-full":
            self.bucket = self.s3.new_bucket()
            yield f"s3://{self.bucket}/media"
            return
        from tests.fs_faults import tiny_filesystem

        with tiny_filesystem(self.folder, size_kib=512) as folder:
            yield str(folder)

    def inject(self) -> None:
        if self.done.wait(self.rng.uniform(0.2, 1.5)):
            return
        if self.kind == "s3-freeze":
            self.s3.freeze()
            self.injected["S3 server frozen (SIGSTOP)"] += 1
            self.done.wait(self.rng.uniform(3.0, 5.0))
            self.s3.resume()
        elif self.kind == "s3-5xx":
            self.proxy.error_share = self.rng.uniform(0.2, 0.5)
            self.injected["S3 answering 500/503"] += 1
        elif self.kind == "s3-slow":
            self.proxy.delay_share, self.proxy.delay_s = self.rng.uniform(0.2, 0.5), 1.0
            self.injected["S3 slow replies"] += 1
        else:
            with contextlib.suppress(OSError), open(self.folder / "filler", "wb") as handle:
                while True:
                    handle.write(b"\0" * 4096)
                    handle.flush()
            self.injected["disk full"] += 1

    def fix(self) -> None:
        self.done.set()
        if self.s3.frozen:
            self.s3.resume()
        self.proxy.error_share = self.proxy.delay_share = 0.0
        with contextlib.suppress(FileNotFoundError):
            (self.folder / "filler").unlink()

    def read(self, key: str) -> bytes | None:
        if self.kind == "disk-full":
            path = self.folder.joinpath(*key.split("/"))
            return path.read_bytes() if path.exists() else None
        try:
            reply = self.s3.client().get_object(Bucket=self.bucket, Key=f"media/{key}")
        except Exception:  # NoSuchKey: missing
            return None
        return bytes(reply["Body"].read())


def _trial(
    engine: Engine, root: Path, trial: int, store: _Store, rng: random.Random, result: Result
) -> tuple[Counter[str], str, Counter[str]]:
    """One generation under the store's fault, then the fix and the recovery command;
    returns the provider's jobs per idempotency key, how the first run ended, the faults."""
    from tests.http_server import PredictionsServer

    with PredictionsServer(processing_polls=3) as server:
        profiles = root / f"providers{trial}.yaml"
        profiles.write_text(
            f"profiles:\n  store-t{trial}:\n    kind: http\n    base_url: {server.base_url}\n"
            "    credential_env: TEST_IMAGE_TOKEN\n    cost_per_image_minor: 5\n"
            "    max_concurrency: 4\n    timeout_s: 2\n    poll_interval_s: 0.1\n"
        )
        os.environ["EPISODIC_PROVIDERS_FILE"] = str(profiles)
        titles = []
        for n in range(_ITEMS):
            download = rng.choice(_DOWNLOADS)
            if download:
                store.injected[download.strip("[]").split(":")[0]] += 1
            titles.append(f"s{trial} i{n} {download}".strip())
        fault = threading.Thread(target=store.inject, daemon=True)
        fault.start()
        first = _generate(engine, root / f"pl{trial}", trial, titles)
        store.fix()
        fault.join(timeout=30)
        if first.state.value != "completed":  # the one recovery command
            again = _generate(engine, None, trial, titles)
            if again.state.value != "completed":
                result.problem(f"trial {trial} ({store.kind}): recovery ended {again.message}")
        # an Idempotency-Key is {installation}-{item key}-{attempt}
        made = Counter(key.rsplit("-", 2)[-2] for key in server.jobs_made.elements())
        store.downloads = sum(server.downloads.values())
        return made, first.state.value, store.injected


def _generate(engine: Engine, folder: Path | None, trial: int, titles: list[str]) -> Any:
    return generate_trial(
        engine, folder, trial, titles, week="2026-W33", prefix="store", concurrency=2
    )


def _audit(
    result: Result,
    engine: Engine,
    url: str,
    root: Path,
    trial: int,
    kind: str,
    made: Counter[str],
    store: _Store,
) -> None:
    """One job per item at the provider, every completed image in the store with its size
    and sha256, nothing stuck, `check` of the episode clean."""
    episode_id = episode_of(engine, f"store-{trial}")
    if len(made) != _ITEMS or set(made.values()) != {1}:
        result.problem(f"trial {trial} ({kind}): provider jobs per item {dict(made)}")
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT i.output_key, i.output_size, i.output_sha256 FROM items i JOIN "
                "episodes e ON e.id = i.episode_pk WHERE e.episode_id = :e AND i.state = "
                "'completed'"
            ),
            {"e": episode_id},
        ).all()
    lost = 0
    for key, size, sha in rows:
        body = store.read(str(key))
        if body is None or len(body) != size or hashlib.sha256(body).hexdigest() != sha:
            lost += 1
    unfinished, stuck, _ = leftovers(engine, episode_id, media_root=Path(store.folder))
    result.stuck = (result.stuck or 0) + stuck
    result.lost += lost
    if lost:
        result.problem(f"trial {trial} ({kind}): {lost} completed images not in the store")
    if unfinished:
        result.problem(f"trial {trial} ({kind}): {unfinished} items not completed")
    check = subprocess.run(
        [EPISODIC, "check", episode_id],
        env={**os.environ, "EPISODIC_DATABASE_URL": url, "EPISODIC_HOME": str(root)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    if check.returncode != 0:
        result.problem(f"trial {trial} ({kind}): check: {check.stdout.strip()[-300:]}")
