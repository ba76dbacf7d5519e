"""Helpers for generation tests: playlists on disk, an allocated and planned episode, the log."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy import Engine

from episodic.core.dedup import Admission
from episodic.core.ids import WeekId
from episodic.core.planning import RunOptions
from episodic.core.settings import Settings, load_settings
from episodic.pipeline.allocation import allocate
from episodic.pipeline.episode_plan import record_plan
from episodic.pipeline.gate import EnvironmentCredentials
from episodic.pipeline.generation import build_runner, generate, prepare
from episodic.pipeline.outcomes import RunOutcome
from episodic.storage.admission import AdmissionStore
from episodic.storage.plans import PlanStore
from episodic.storage.runs import RunStore
from episodic.testing.fake_jobs import FakeJobs


def write_playlist(
    folder: Path,
    titles: list[str],
    *,
    template_version: int = 1,
    seeds: list[int] | None = None,
    prompt: str = "cover for {title} part {part}",
    references: dict[str, str] | None = None,
    parts: dict[int, list[int]] | None = None,
    profile: str = "fake",
    hero: dict[int, int | bool] | None = None,
    hero_all: int | None = None,
) -> Path:
    """A playlist of `titles` (videos v01, v02, ...). `hero`: video number -> candidates
    (False: `hero: false`); `hero_all`: the playlist-wide hero run's candidates."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in (references or {}).items():
        (folder / name).write_text(text)
    items = []
    for n, title in enumerate(titles, start=1):
        video: dict[str, Any] = {
            "video_id": f"v{n:02d}",
            "title": title,
            "seed": (seeds or [])[n - 1] if seeds else 100 + n,
        }
        if parts and n in parts:
            video["parts"] = parts[n]
        if hero and n in hero:
            count = hero[n]
            video["hero"] = False if count is False else {"candidates": count}
        items.append(video)
    data = {
        "template": {"id": "cover", "version": template_version, "prompt": prompt},
        "provider_profile": profile,
        "reference_assets": sorted(references or {}),
        "items": items,
    }
    if hero_all is not None:
        data["hero"] = {"candidates": hero_all}
    path = folder / "playlist.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def provider_log(path: str | None = None) -> list[dict[str, Any]]:
    """The fake provider's log: `path`, default EPISODIC_FAKE_PROVIDER_LOG."""
    return FakeJobs(Path(path or os.environ["EPISODIC_FAKE_PROVIDER_LOG"])).events()


def stored_image(key: str) -> bytes:
    """The bytes the media store of this environment's settings holds under `key`."""
    from episodic.storage.media import MediaStore

    return MediaStore.from_settings(load_settings()).read(key)


def store_file(key: str) -> Path:
    """The file under which this environment's local media store keeps `key`."""
    from episodic.storage.media import MediaStore

    root = Path(MediaStore.from_settings(load_settings()).describe())
    return root.joinpath(*key.split("/"))


def stored_image_file(
    url: str, home: Path, video_id: str, part: int = 1, candidate: int | None = None
) -> Path:
    """The file of the completed image of `video_id`'s `part` (or hero `candidate`, part 0)
    in the default local media store of `home` (``home/media``), by the key the database
    at `url` records."""
    from sqlalchemy import text

    from episodic.storage.engine import make_engine

    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            key = conn.execute(
                text(
                    "SELECT output_key FROM items WHERE state = 'completed' AND video_id = :v "
                    "AND part = :p AND coalesce(candidate, 0) = :c ORDER BY id DESC"
                ),
                {"v": video_id, "p": 0 if candidate else part, "c": candidate or 0},
            ).first()
    finally:
        engine.dispose()
    assert key is not None and key[0], f"no stored image of {video_id}"
    return home.joinpath("media", *str(key[0]).split("/"))


def image_keys(engine: Engine) -> list[tuple[str, str, int, str]]:
    """(key, sha256, size, media type) of every completed item's image, checked: the row
    records no machine path, and the store holds exactly those bytes under the key."""
    import hashlib

    from sqlalchemy import text

    from episodic.core.media import content_key

    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT output_key, output_sha256, output_size, output_media_type, output_path "
                "FROM items WHERE state = 'completed' ORDER BY id"
            )
        ).all()
    found = []
    for key, sha, size, media_type, path in rows:
        assert path is None and key == content_key(sha, media_type)
        held = stored_image(key)
        assert len(held) == size and hashlib.sha256(held).hexdigest() == sha
        found.append((str(key), str(sha), int(size), str(media_type)))
    return found


def submissions_per_item() -> Counter[str]:
    return Counter(e["item_id"] for e in provider_log() if e["event"] == "submit")


@dataclass
class Episode:
    engine: Engine
    episode_id: str

    @property
    def settings(self) -> Settings:
        return load_settings()

    def plan(self, playlist: Path) -> None:
        record_plan(self.engine, "weekly", self.episode_id, playlist)

    def generate(self, *, dedup: dict[str, Any] | None = None, **options: Any) -> RunOutcome:
        """Through the Python API (the choke point); `dedup` passes idempotency_key,
        batch_id or allow_duplicate."""
        return generate(
            self.engine,
            self.settings,
            "weekly",
            self.episode_id,
            RunOptions(**options),
            EnvironmentCredentials(),
            **(dedup or {}),
        )

    def resume(self, run_id: str, **overrides: Any) -> RunOutcome:
        from dataclasses import replace

        from episodic.pipeline.admission import dedup_policy, prepare_resume

        store = RunStore(self.engine)
        run = store.get_run(run_id)
        admission = prepare_resume(
            store, AdmissionStore(self.engine), run_id, dedup_policy(self.settings)
        )
        prepared = prepare(self.engine, self.settings, "weekly", self.episode_id, "resume")
        options = replace(RunOptions.from_params(run.params), **overrides)
        return build_runner(self.engine, self.settings, prepared, EnvironmentCredentials()).execute(
            run_id, options, deduplicated=admission.deduplicated
        )


def admit(
    engine: Engine,
    episode_id: str,
    options: RunOptions | None = None,
    **dedup: Any,
) -> Admission:
    """The choke point alone (plan, budget, admission; nothing executed), with dedup options
    (idempotency_key, batch_id, allow_duplicate)."""
    from episodic.pipeline.admission import admit_run, dedup_policy, plan, run_request

    settings = load_settings()
    prepared = prepare(engine, settings, "weekly", episode_id, "generate")
    opts = options or RunOptions()
    report = plan(PlanStore(engine), prepared.gate, prepared.items, opts, prepared.profile)
    request = run_request(prepared.gate, prepared.items, opts, prepared.profile, **dedup)
    return admit_run(
        AdmissionStore(engine),
        prepared.gate,
        prepared.items,
        report,
        opts,
        prepared.profile,
        request,
        dedup_policy(settings),
    )


def new_run(episode: Episode, options: RunOptions | None = None) -> str:
    """A run of every planned item through the choke point, not started (pending)."""
    run_id = admit(episode.engine, episode.episode_id, options, allow_duplicate=True).run_id
    assert run_id is not None
    return run_id


def new_episode(engine: Engine, key: str = "test:1") -> Episode:
    allocation = allocate(engine, "weekly", WeekId.parse("2026-W32"), key)
    return Episode(engine, str(allocation.episode.episode_id))


def item_key_of(client_reference: str) -> str:
    """The item idempotency key in a client reference: ``{installation}-{key}-{attempt}``
    (``{key}-{attempt}`` for submissions made before migration 0012)."""
    return client_reference.rsplit("-", 2)[-2]


def jobs_per_key() -> Counter[str]:
    """Jobs the fake provider really made, per item idempotency key (its own log)."""
    return Counter(
        item_key_of(e["client_reference"]) for e in provider_log() if e["event"] == "job_created"
    )


def made_jobs_per_key(home: Path | None = None) -> Counter[str]:
    """Jobs the fake provider holds, per item idempotency key: one file per job it made, in
    its state folder under `home` (default EPISODIC_HOME), or the shared one
    EPISODIC_FAKE_PROVIDER_DIR names. After a `kill -9` count these,
    not `jobs_per_key`: the fake runs in the killed process, and a kill between a job's
    creation and its `job_created` log line leaves a job the log does not show (a second
    payment could then hide behind it). The same count as the fault suite's."""
    from episodic.providers.fake import jobs_folder

    folder = jobs_folder(home or Path(os.environ["EPISODIC_HOME"]))  # EPISODIC_FAKE_PROVIDER_DIR
    return Counter(
        item_key_of(json.loads(path.read_text())["client_reference"])
        for path in folder.glob("*.json")
    )


def creates_per_key() -> Counter[str]:
    """Create calls that reached the fake provider, per item idempotency key."""
    return Counter(
        item_key_of(e["client_reference"]) for e in provider_log() if e["event"] == "submit"
    )


def generate_in_background(*args: str) -> subprocess.Popen[str]:
    """A real `episodic generate ARGS` process with this environment, its output piped: for
    kills and races in the middle of a run (`until_jobs` waits for its progress)."""
    from tests.acceptance.conftest import EPISODIC

    assert EPISODIC is not None
    return subprocess.Popen(
        [EPISODIC, "generate", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )


def until_jobs(process: subprocess.Popen[str], jobs: int, timeout_s: float = 60) -> None:
    """Wait until the fake provider has made `jobs` jobs (its own log) while `process`
    still runs; fails if it ends first or makes no progress."""
    deadline = time.monotonic() + timeout_s
    while sum(1 for e in provider_log() if e["event"] == "job_created") < jobs:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "generate made no progress"
        time.sleep(0.05)


def jobs_of_process(pid: int, log: list[dict[str, Any]] | None = None) -> int:
    """Jobs process `pid` made at the fake provider (its log, default this environment's)."""
    log = provider_log() if log is None else log
    return sum(1 for e in log if e["event"] == "job_created" and e["pid"] == pid)


def outstanding_of_process(pid: int, log: list[dict[str, Any]] | None = None) -> int:
    """Jobs process `pid` made at the fake provider and did not collect (its log)."""
    log = provider_log() if log is None else log
    made = {e["remote_ref"] for e in log if e["event"] == "job_created" and e["pid"] == pid}
    taken = {e["remote_ref"] for e in log if e["event"] == "collect" and e["pid"] == pid}
    return len(made - taken)


def signal_storm(
    episodes: list[str],
    sig: signal.Signals,
    *,
    env: dict[str, str] | None = None,
    victims: int = 2,
    pause: Callable[[], float] | None = None,
    required: bool = True,
) -> list[tuple[str, bool, int, str]]:
    """A real `episodic generate E --json --concurrency 3` of each of `episodes`, started
    together with `env` (default this environment); the first `victims` of them seen with a
    job accepted at the fake provider and not yet collected get `sig`. With `pause`, a
    process is signalled `pause()` seconds after it is first seen so (a random moment while
    its jobs are at the provider), if it still has a job there then, else it waits for its
    next one. Returns (episode, signalled, exit code, stderr) of each, the signalled first;
    fails (unless `required` is False) if fewer than `victims` processes had a job at the
    provider to be signalled in before every process ended."""
    from tests.acceptance.conftest import EPISODIC

    assert EPISODIC is not None
    env = os.environ.copy() if env is None else env
    log_path = env["EPISODIC_FAKE_PROVIDER_LOG"]
    processes = [
        subprocess.Popen(
            [EPISODIC, "generate", e, "--json", "--concurrency", "3"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for e in episodes
    ]
    signalled: set[int] = set()
    due: dict[int, float] = {}  # pid -> when it is signalled if its job is still out
    deadline = time.monotonic() + 120
    while (
        len(signalled) < victims
        and time.monotonic() < deadline
        and any(p.poll() is None for p in processes)
    ):
        log = provider_log(log_path)
        now = time.monotonic()
        for process in processes:
            pid = process.pid
            if pid in signalled or process.poll() is not None:
                continue
            if not outstanding_of_process(pid, log):
                due.pop(pid, None)
                continue
            if now < due.setdefault(pid, now + (pause() if pause else 0)):
                continue
            process.send_signal(sig)
            signalled.add(pid)
            if len(signalled) == victims:
                break
        time.sleep(0.02)
    ended = [(p, e, *p.communicate(timeout=240)) for p, e in zip(processes, episodes, strict=True)]
    assert not required or len(signalled) == victims, f"{len(signalled)} of {victims} signalled"
    ended.sort(key=lambda one: one[0].pid not in signalled)
    return [(e, p.pid in signalled, p.returncode, err) for p, e, _out, err in ended]
