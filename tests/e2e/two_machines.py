"""Two machines on one Prefect server: paid media outlive the machine that bought them.

The library behind ``tests/e2e/test_two_machines.py`` and the two-machine part of
``make ui-check`` (``tests/ui/two_machines_check.py``): both drive the same steps, the
browser check adds only the Chromium step between `generated_on_a` and `approved_on_b`.

    with two_machines(work, database_url) as stack:
        outcome = story(stack, look=None)  # or look=a browser step, given the form

`story` is the whole order: `generated_on_a` (A's folder is gone afterwards), `form`
(thumbnails from the store), ``look(stack, flow_run_id, form)``, `approved_on_b` (assembly on
B), `checked_on_b` (`episodic check --all --json`), the episode's media in the bucket and the
provider's log; each step raises `TwoMachinesFailed` in one line when it does not hold.

Each machine is a copy of the project folder (`tests.project_copy`) with its own virtualenv
and its own state folder (``<copy>/.episodic``, no EPISODIC_HOME set) and Prefect home; its
worker runs with the copy's python, in the copy. What they share is what machines share:
the database (EPISODIC_DATABASE_URL), the media store (EPISODIC_MEDIA_URL=s3://… on a moto
S3 server, the AWS variables), the Prefect server, and the provider (the fake provider's log
and its job store, EPISODIC_FAKE_PROVIDER_DIR: the provider's side, in a folder of its own).
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import shutil
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.e2e.stack import (
    PrefectServer,
    Worker,
    api_request,
    create_flow_run,
    read_deployment,
    read_flow_run,
    run_cli,
    wait_for_flow_run,
)
from tests.generation import item_key_of
from tests.project_copy import PROJECT, ProjectCopy, make_project_copy
from tests.s3_server import S3Server

PLANNED_ITEMS = 14  # examples/playlist.yaml
DATA_JPEG = "data:image/jpeg;base64,"
PREFIX = "media"
POOL = "episodic"
WAIT_S = 600.0  # a bound for a loaded 2-core machine, not a pause: waits end on a condition
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp")


class TwoMachinesFailed(AssertionError):
    """What did not hold; one line."""


@dataclass
class Machine:
    name: str
    copy: ProjectCopy
    env: dict[str, str]

    @property
    def folder(self) -> Path:
        return self.copy.folder

    def episodic(self, *args: str, timeout: float = 300.0) -> Any:
        """This machine's own `episodic` command, run in its folder."""
        return run_cli(
            list(args), self.env, self.folder, program=[str(self.copy.episodic)], timeout=timeout
        )


@dataclass
class Form:
    """The suspended run's approval form as the server holds it."""

    description: str
    schema: dict[str, Any]
    previews: dict[str, str] = field(default_factory=dict)  # label -> data URI


@dataclass
class TwoMachines:
    work: Path
    server: PrefectServer
    s3: S3Server
    bucket: str
    a: Machine
    b: Machine
    provider_log: Path
    workers: list[Worker] = field(default_factory=list)

    # -- the steps ---------------------------------------------------------------------------

    def generated_on_a(self, week: str) -> str:
        """The weekly chain on A's worker alone, until it suspends at its approval form; then
        A's worker stops and A's folder is deleted. Returns the flow run id."""
        weekly = read_deployment(self.server, "weekly-episode", "weekly")
        shipped = _images_in(self.a.folder)  # the project's own example files
        with self._worker(self.a):
            run = create_flow_run(self.server, weekly["id"], parameters={"week": week})
            wait_for_flow_run(self.server, run["id"], ("PAUSED",), timeout=WAIT_S)
        local = sorted(_images_in(self.a.folder) - shipped)
        if local:  # what A bought lives in the store, not on A
            raise TwoMachinesFailed(f"machine A kept images in its folder: {local[:3]}")
        shutil.rmtree(self.a.folder)
        return str(run["id"])

    def form(self, flow_run_id: str) -> Form:
        """The form of the suspended run, read from the API: one preview per image, each a
        JPEG that decodes, each the thumbnail of an image object in the S3 store."""
        from PIL import Image

        from episodic.pipeline.thumbnails import thumbnail_data_uri

        run = read_flow_run(self.server, flow_run_id)
        keyset = (run.get("state") or {}).get("state_details", {}).get("run_input_keyset")
        if not keyset:
            raise TwoMachinesFailed(f"flow run {flow_run_id} has no input form: {run['state']}")
        description = api_request(
            self.server, "GET", f"/flow_runs/{flow_run_id}/input/{keyset['description']}"
        )
        schema = api_request(
            self.server, "GET", f"/flow_runs/{flow_run_id}/input/{keyset['schema']}"
        )
        form = Form(str(description), dict(schema))
        for chunk in form.description.split("![")[1:]:
            label, rest = chunk.split("](", 1)
            if rest.startswith(DATA_JPEG):
                form.previews[label] = rest[: rest.index(")")]
        if len(form.previews) != PLANNED_ITEMS:
            raise TwoMachinesFailed(
                f"the form shows {len(form.previews)} previews for {PLANNED_ITEMS} images"
            )
        for label, uri in form.previews.items():
            with Image.open(io.BytesIO(base64.b64decode(uri[len(DATA_JPEG) :]))) as image:
                image.load()
                if image.format != "JPEG" or min(image.size) <= 0:
                    raise TwoMachinesFailed(f"the preview of {label} is not a JPEG image")
        from_store = {
            thumbnail_data_uri(self.object(k)) for k in self.objects() if k.endswith(IMAGE_SUFFIXES)
        }
        strangers = sorted(label for label, uri in form.previews.items() if uri not in from_store)
        if strangers:
            raise TwoMachinesFailed(f"previews not made from an object in the store: {strangers}")
        return form

    def approved_on_b(self, flow_run_id: str, reviewer: str = "ann") -> dict[str, Any]:
        """Resume the run with an approval; B's worker alone takes it and assembles."""
        answer = {"decision": "approve", "reviewer": reviewer}
        with self._worker(self.b):
            result = api_request(
                self.server, "POST", f"/flow_runs/{flow_run_id}/resume", json={"run_input": answer}
            )
            if result["status"] != "ACCEPT":
                raise TwoMachinesFailed(f"the approval was not accepted: {result}")
            return wait_for_flow_run(self.server, flow_run_id, ("COMPLETED",), timeout=WAIT_S)

    def checked_on_b(self) -> dict[str, Any]:
        """B's `episodic check --all --json`: exit 0, clean, no warning."""
        checked = self.b.episodic("check", "--all", "--json")
        report = json.loads(checked.stdout or "{}")
        if checked.returncode != 0 or not report.get("clean") or report.get("warnings"):
            raise TwoMachinesFailed(
                f"check --all on B: {checked.returncode} {checked.stdout}{checked.stderr[-2000:]}"
            )
        return dict(report)

    def media_of(self, episode_id: str) -> list[dict[str, Any]]:
        """`episodes show --json`'s media on B: every image, the cover, the manifest."""
        shown = self.b.episodic("episodes", "show", episode_id, "--json")
        if shown.returncode != 0:
            raise TwoMachinesFailed(f"episodes show on B: {shown.stderr[-2000:]}")
        return list(json.loads(shown.stdout)["media"])

    # -- what the servers say ------------------------------------------------------------------

    def objects(self) -> list[str]:
        """Every key in the bucket under the store's prefix (S3's own listing)."""
        pages = self.s3.client().get_paginator("list_objects_v2")
        return [
            o["Key"]
            for p in pages.paginate(Bucket=self.bucket, Prefix=f"{PREFIX}/")
            for o in p.get("Contents", [])
        ]

    def object(self, key: str) -> bytes:
        return bytes(self.s3.client().get_object(Bucket=self.bucket, Key=key)["Body"].read())

    def jobs_per_item(self) -> Counter[str]:
        """Jobs the provider made, per item key: its own log, never our tables."""
        lines = self.provider_log.read_text().splitlines() if self.provider_log.exists() else []
        events = [json.loads(line) for line in lines if line]
        return Counter(
            item_key_of(e["client_reference"]) for e in events if e["event"] == "job_created"
        )

    @contextlib.contextmanager
    def _worker(self, machine: Machine) -> Iterator[Worker]:
        worker = Worker(
            self.server,
            POOL,
            cwd=machine.folder,
            extra_env=machine.env,
            python=machine.copy.python,
            name=f"machine-{machine.name}",
        )
        self.workers.append(worker)
        with worker:
            yield worker


@dataclass
class Outcome:
    flow_run_id: str
    episode_id: str
    form: Form
    run: dict[str, Any]  # the flow run after assembly
    check: dict[str, Any]  # B's `check --all --json`
    media: dict[str, dict[str, Any]]  # B's `episodes show --json` media, by name
    objects: list[str]  # the bucket's keys under the store's prefix
    jobs: Counter[str]  # the provider's jobs per item key


Look = Callable[[TwoMachines, str, Form], None]


def story(stack: TwoMachines, week: str = "2026-W46", look: Look | None = None) -> Outcome:
    """The two-machine story in order (the module's docstring); ``look`` runs while the run
    waits at its form, A's folder gone (the browser's step in `make ui-check`)."""
    flow_run_id = stack.generated_on_a(week)
    episode_id = f"{week}-0"
    if stack.a.folder.exists():
        raise TwoMachinesFailed(f"machine A's folder {stack.a.folder} is still there")
    weekly = read_deployment(stack.server, "weekly-episode", "weekly")
    for where in (stack.a.folder, stack.b.folder):
        if str(where) in json.dumps(weekly) + json.dumps(read_flow_run(stack.server, flow_run_id)):
            raise TwoMachinesFailed(f"the deployment or the flow run names {where}")
    form = stack.form(flow_run_id)
    if look is not None:
        look(stack, flow_run_id, form)
    run = stack.approved_on_b(flow_run_id)
    if run["state_name"] != "Completed" or episode_id not in run["name"]:
        raise TwoMachinesFailed(f"the resumed run ended {run['state_name']} as {run['name']}")
    if flow_run_id not in stack.workers[-1].log_text():
        raise TwoMachinesFailed("B's worker did not run the resumed run")
    check = stack.checked_on_b()
    media = {m["name"]: m for m in stack.media_of(episode_id)}
    objects = stack.objects()
    missing = sorted(n for n, m in media.items() if f"{PREFIX}/{m['key']}" not in objects)
    if missing or {"cover", "manifest"} - set(media):
        raise TwoMachinesFailed(f"not in the bucket: {missing}; media {sorted(media)}")
    return Outcome(flow_run_id, episode_id, form, run, check, media, objects, stack.jobs_per_item())


def _machine(name: str, work: Path, shared: dict[str, str], server: PrefectServer) -> Machine:
    copy = make_project_copy(work / f"machine-{name}")
    shutil.copy2(PROJECT / "prefect.yaml", copy.folder / "prefect.yaml")
    # make_project_copy copied examples/ (the example playlist is package data)
    env = {k: v for k, v in server.env(shared).items() if not k.startswith("EPISODIC_")}
    env.update(shared)
    env["PREFECT_HOME"] = str(copy.folder / ".episodic" / "prefect")  # this machine's own
    Path(env["PREFECT_HOME"]).mkdir(parents=True)  # Prefect makes no parent folder
    return Machine(name, copy, env)


@contextlib.contextmanager
def two_machines(
    work: Path, database_url: str, prefect_database_url: str | None = None
) -> Iterator[TwoMachines]:
    """A moto S3 server and its bucket, a Prefect server, machines A and B; the database
    migrated, `episodic prefect setup` and `prefect deploy --all` run on A, as a user would.
    ``database_url`` must name an empty database every machine reaches."""
    if "EPISODIC_HOME" in os.environ:
        raise TwoMachinesFailed("EPISODIC_HOME is set: each machine must use its own folder")
    s3 = S3Server(work / "s3").start()
    try:
        bucket = s3.new_bucket()
        provider_log = work / "provider" / "provider.jsonl"  # the provider's side
        provider_log.parent.mkdir(parents=True)
        shared = {
            **s3.env(),
            "EPISODIC_DATABASE_URL": database_url,
            "EPISODIC_MEDIA_URL": f"s3://{bucket}/{PREFIX}",
            "EPISODIC_FAKE_PROVIDER_LOG": str(provider_log),
            # the fake's job store is the provider's side too: one for both machines
            "EPISODIC_FAKE_PROVIDER_DIR": str(provider_log.parent / "jobs"),
            "EPISODIC_FAKE_DELAY_MS": "100",
            "EPISODIC_TIMEZONE": "UTC",
        }
        # `prefect deploy --all` registers the real Mon/Thu 09:00 schedules: with the
        # scheduler off, a test that straddles one starts no weekly run of its own.
        no_scheduler = {"PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED": "false"}
        with PrefectServer(
            work / "stack", database_url=prefect_database_url, settings=no_scheduler
        ) as server:
            a, b = (_machine(n, work, shared, server) for n in ("a", "b"))
            stack = TwoMachines(work, server, s3, bucket, a, b, provider_log)
            try:
                _deployed_from(a)
                yield stack
            finally:
                for worker in stack.workers:
                    worker.stop()
    finally:
        s3.stop()


def _deployed_from(a: Machine) -> None:
    upgraded = a.episodic("db", "upgrade")
    if upgraded.returncode != 0:
        raise TwoMachinesFailed(f"db upgrade on A: {upgraded.stderr[-2000:]}")
    setup = a.episodic("prefect", "setup", "--work-pool", POOL, "--json")
    if setup.returncode != 0:
        raise TwoMachinesFailed(f"prefect setup on A: {setup.stderr[-2000:]}")
    storage = json.loads(setup.stdout)["result_storage"]
    if not str(storage).startswith("remote-file-system/episodic-results-"):
        raise TwoMachinesFailed(f"results would stay on the machine: {storage}")
    deployed = run_cli(
        ["deploy", "--all"],
        a.env,
        a.folder,
        timeout=600,
        program=[str(a.copy.python), "-m", "prefect"],
    )
    if deployed.returncode != 0:
        raise TwoMachinesFailed(
            f"prefect deploy --all on A: {deployed.stdout[-3000:]}{deployed.stderr[-3000:]}"
        )


def _images_in(folder: Path) -> set[Path]:
    """Every image file under `folder`, outside its virtualenv."""
    return {
        p
        for p in folder.rglob("*")
        if p.suffix.lower() in IMAGE_SUFFIXES and ".venv" not in p.parts
    }
