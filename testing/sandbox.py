"""A state folder of a test's own, and a week driven through it as a person drives one.

`Sandbox` is an episodic installation in a folder: its database (the embedded SQLite file,
or a PostgreSQL database the plugin gives it), its media store and the fake provider's job
store and log. Each step is the ``episodic`` command a person types, run in-process
(`episodic.cli.app.run`) with ``--json``, so a test proves what the command line does and
reads what a script would read:

    week = sandbox.plan("playlists/weekly.yaml", week="2026-W32")
    week.generate(max_cost="0.60")
    week.approve(by="reviewer")
    week.assemble()
    assert week.spend() == {"USD": Decimal("0.56")}
    assert set(week.jobs_per_item().values()) == {1}

A step whose command exits other than expected raises `CommandFailed` with the command, its
exit code (`episodic.core.exit_codes.ExitCode`) and its error line.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from episodic.core.exit_codes import ExitCode
from episodic.testing.fake_jobs import FakeJobs, with_faults


class CommandFailed(AssertionError):
    """An ``episodic`` command of a test exited with a code the step did not expect."""

    def __init__(self, args: list[str], code: int, stderr: str) -> None:
        self.args_given, self.code, self.stderr = args, code, stderr
        said = stderr.strip().splitlines()[-1] if stderr.strip() else "(nothing on stderr)"
        super().__init__(f"episodic {' '.join(args)} exited {code}: {said}")


@dataclass(frozen=True)
class Answer:
    """One command's answer: its exit code, what it printed, and the JSON it printed
    (None when it printed none)."""

    code: int
    stdout: str
    stderr: str

    @property
    def json(self) -> Any:
        text = self.stdout.strip()
        return json.loads(text) if text.startswith(("{", "[")) else None


def environment(home: Path, database_url: str | None = None) -> dict[str, str | None]:
    """The variables a sandbox at `home` sets (None: removed): its state folder, the fake
    provider's log, its database when not the embedded default."""
    return {
        "EPISODIC_HOME": str(home),
        "EPISODIC_FAKE_PROVIDER_LOG": str(home / "fake-provider-log.jsonl"),
        "EPISODIC_DATABASE_URL": database_url,
        "EPISODIC_MEDIA_URL": None,  # the state folder's own media/
        "EPISODIC_FAKE_PROVIDER_DIR": None,  # the state folder's own fake-provider/
    }


@contextlib.contextmanager
def _set(variables: Mapping[str, str | None]) -> Iterator[None]:
    before = {name: os.environ.get(name) for name in variables}
    try:
        for name, value in variables.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class Sandbox:
    """An episodic installation in `home` (created if missing). `database_url`: a database
    of its own (None: the embedded SQLite file in `home`). `providers`: a providers file
    (None: the built-in ``fake`` profile and any file ``EPISODIC_PROVIDERS_FILE`` names).

    Commands run with the sandbox's variables set for their duration only: a test process
    can hold several sandboxes."""

    def __init__(
        self,
        home: Path,
        *,
        database_url: str | None = None,
        providers: Path | None = None,
        pipeline: str = "weekly",
    ) -> None:
        self.home = Path(home)
        self.home.mkdir(parents=True, exist_ok=True)
        self.database_url = database_url
        self.providers = providers
        self.pipeline = pipeline
        self.fake = FakeJobs(self.home / "fake-provider-log.jsonl")

    @property
    def variables(self) -> dict[str, str | None]:
        found = environment(self.home, self.database_url)
        if self.providers is not None:
            found["EPISODIC_PROVIDERS_FILE"] = str(Path(self.providers).resolve())
        return found

    @contextlib.contextmanager
    def with_environment(self) -> Iterator[Sandbox]:
        """The sandbox's variables set in this process for the block (a flow of the team's
        own, whose tasks read them), the earlier values back after it."""
        with _set(self.variables):
            yield self

    def episodic(self, *args: str | Path, expect: Iterable[int] = (ExitCode.OK,)) -> Answer:
        """``episodic ARGS…`` in this process; its answer. Raises `CommandFailed` when its
        exit code is not in `expect`."""
        from episodic.cli.app import run
        from episodic.storage.registry import dispose_all

        argv = [str(a) for a in args]
        out, err = io.StringIO(), io.StringIO()
        with (
            _set(self.variables),
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
        ):
            try:
                code = run(argv)
            finally:
                dispose_all()  # no connection outlives the command (a database is dropped after)
        answer = Answer(int(code), out.getvalue(), err.getvalue())
        if answer.code not in set(expect):
            raise CommandFailed(argv, answer.code, answer.stderr)
        return answer

    def plan(
        self,
        playlist: str | Path,
        *,
        week: str,
        key: str | None = None,
        faults: Mapping[str, str] | None = None,
    ) -> Week:
        """An episode of `week` (an ISO week, ``2026-W32``) allocated under `key` (default:
        one per call) and planned from `playlist`; with `faults` (video id → a marker of
        `episodic.testing.fake_jobs`), from a copy of it whose videos carry them. The same
        `key` again is the same invocation: the same episode, planned again."""
        path = Path(playlist)
        if faults:
            copy = self.home / "rehearsals" / f"{week}-{uuid.uuid4().hex[:12]}"
            path = with_faults(path, dict(faults), copy / path.name)
        key = key or f"test:{uuid.uuid4().hex}"
        allocated = self.episodic(
            "allocate", "--pipeline", self.pipeline, "--key", key, "--week", week, "--json"
        ).json
        episode_id = str(allocated["episode_id"])
        planned = self.episodic(
            "plan", episode_id, "--pipeline", self.pipeline, "--playlist", path, "--json"
        ).json
        return Week(self, episode_id, int(planned["images"]))

    def episodes(self) -> list[str]:
        """The pipeline's episode ids, oldest week first."""
        listed = self.episodic("episodes", "list", "--pipeline", self.pipeline, "--json").json
        return [str(row["episode_id"]) for row in listed or []]

    def spend(self) -> dict[str, Decimal]:
        """What the ledger says the pipeline spent, per currency (never summed across them)."""
        totals = self.episodic("spend", "--pipeline", self.pipeline, "--json").json["totals"]
        return {str(t["currency"]): Decimal(t["spent"]) for t in totals}


@dataclass(frozen=True)
class Week:
    """One planned episode of a sandbox: `episode_id` and the `images` its plan buys."""

    sandbox: Sandbox
    episode_id: str
    images: int

    def generate(
        self,
        *,
        max_cost: str | Decimal | None = None,
        max_images: int | None = None,
        concurrency: int | None = None,
        expect: Iterable[int] = (ExitCode.OK,),
    ) -> dict[str, Any]:
        """``episodic generate`` of the episode; its JSON answer (``completed``, ``failed``,
        ``paid_submissions``, ``cost_micros``, ``currency``, ``state``, ``exit_code``, ...).
        `max_cost` in the profile's currency, as on the command line (``"0.60"``)."""
        args = ["generate", self.episode_id, "--pipeline", self.sandbox.pipeline, "--json"]
        if max_cost is not None:
            args += ["--max-cost", str(max_cost)]
        if max_images is not None:
            args += ["--max-images", str(max_images)]
        if concurrency is not None:
            args += ["--concurrency", str(concurrency)]
        answer = self.sandbox.episodic(*args, expect=expect)
        return dict(answer.json or {"exit_code": answer.code, "error": answer.stderr.strip()})

    def approve(self, *, by: str, expect: Iterable[int] = (ExitCode.OK,)) -> dict[str, Any]:
        """``episodic approve --by BY``: the episode's images approved by `by`."""
        args = ["approve", self.episode_id, "--pipeline", self.sandbox.pipeline, "--by", by]
        return dict(self.sandbox.episodic(*args, "--json", expect=expect).json or {})

    def reject(self, *, by: str, reason: str) -> dict[str, Any]:
        """``episodic approve --reject``: the images rejected by `by`, with `reason`."""
        args = ["approve", self.episode_id, "--pipeline", self.sandbox.pipeline, "--by", by]
        return dict(self.sandbox.episodic(*args, "--reject", "--reason", reason, "--json").json)

    def assemble(self, expect: Iterable[int] = (ExitCode.OK,)) -> dict[str, Any]:
        """``episodic assemble``: the cover and manifest written to the media store."""
        args = ["assemble", self.episode_id, "--pipeline", self.sandbox.pipeline, "--json"]
        return dict(self.sandbox.episodic(*args, expect=expect).json or {})

    def state(self) -> str:
        """The episode's state (``planned``, ``generated``, ``approved``, ``assembled``, ...)."""
        args = ["episodes", "show", self.episode_id, "--pipeline", self.sandbox.pipeline]
        return str(self.sandbox.episodic(*args, "--json").json["state"])

    def spend(self) -> dict[str, Decimal]:
        """What the ledger says this episode spent, per currency."""
        args = ["episodes", "show", self.episode_id, "--pipeline", self.sandbox.pipeline]
        costs = self.sandbox.episodic(*args, "--json").json["costs"]  # micro-units
        return {str(currency): Decimal(int(m)) / 1_000_000 for currency, m in costs.items()}

    def jobs_per_item(self) -> dict[str, int]:
        """Jobs the fake provider made for this episode, per item (``{"v01.p1": 1, ...}``),
        from the provider's own log: where the money is spent."""
        return self.sandbox.fake.jobs_per_item(self.episode_id)

    def billed(self) -> Decimal:
        """What the fake provider billed for this episode's jobs, in its currency's units."""
        return Decimal(self.sandbox.fake.billed_micros(self.episode_id)) / 1_000_000
