"""Settings read from the environment (``EPISODIC_`` prefix) and validated once, here."""

from __future__ import annotations

import re
from functools import cache, cached_property
from pathlib import Path
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from episodic.core.errors import InvalidInput
from episodic.core.home import default_home, has_control_character, project_folder, resolve_home

_PIPELINE_RE = re.compile(r"[a-z0-9][a-z0-9_.-]{0,62}")
# The pipeline whose item keys and folders predate pipeline scoping: they stay unscoped, so
# nothing an existing home paid for changes key or moves.
UNSCOPED_PIPELINE = "weekly"
_SQLITE_URL_RE = re.compile(r"sqlite(?:\+\w+)?://[^/]*/([^?]*)")
MAX_HOME_CHARS = 600  # an image path under it stays within its 1024-character column


def validate_pipeline(name: str) -> str:
    """Pipeline names are short lowercase slugs: they appear in lock names and keys."""
    if not isinstance(name, str) or not _PIPELINE_RE.fullmatch(name):
        raise InvalidInput(
            f"invalid pipeline name {name!r}: "
            "use 1-63 of a-z 0-9 _ . - starting with a letter or digit"
        )
    return name


# Names the tz database answers for that mean a different zone on every host.
_HOST_DEPENDENT_ZONES = frozenset({"localtime", "Factory", "posixrules"})


@cache
def _known_zones() -> frozenset[str]:
    return frozenset(available_timezones()) - _HOST_DEPENDENT_ZONES


def load_timezone(name: str) -> ZoneInfo:
    """An IANA zone by name. Refused (`InvalidInput`): unknown names, paths, and names whose
    meaning depends on the host (``localtime``): every worker must compute the same week."""
    if not isinstance(name, str) or name not in _known_zones():
        raise InvalidInput(
            f"unknown timezone {name!r} (expected an IANA name such as Europe/Berlin)"
        )
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidInput(
            f"unknown timezone {name!r} (expected an IANA name such as Europe/Berlin)"
        ) from None


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="EPISODIC_", frozen=True, extra="ignore")

    home: Path = Field(
        default_factory=default_home,
        validate_default=True,
        description="state folder: SQLite file, locks, episodes, Prefect home; default: the "
        "project's .episodic wherever a command starts (core.home); relative: to the project",
    )
    database_url: str | None = Field(
        default=None, description="SQLAlchemy URL; default: SQLite under home"
    )
    timezone: str = Field(
        default="UTC",
        description="IANA timezone recorded for a new pipeline; when set, it must match the "
        "pipeline's recorded one",
    )
    pipeline: str = Field(default="weekly", description="pipeline name: own lock, own sequences")
    providers_file: Path | None = Field(default=None, description="provider profiles YAML")
    lease_s: float = Field(
        default=30.0,
        ge=5.0,  # renewed every third: under 5 s a loaded host misses renewals
        le=3600.0,
        allow_inf_nan=False,
        description="seconds a claim on an item lives without a heartbeat (renewed every third)",
    )
    dedup_window_s: float = Field(
        default=900.0,
        ge=0.0,
        le=7 * 24 * 3600.0,
        allow_inf_nan=False,
        description="seconds within which an identical request joins the active run (0: never)",
    )
    pending_ttl_s: float = Field(
        default=900.0,
        ge=10.0,
        le=30 * 24 * 3600.0,
        allow_inf_nan=False,
        description="seconds after which the sweep cancels a run or flow run that never started",
    )

    media_url: str | None = Field(
        default=None,
        min_length=1,
        max_length=1000,
        description="where paid images, covers and manifests are kept: a folder, file://, "
        "s3://bucket/prefix (or gs://, az:// with gcsfs/adlfs); credentials come from the "
        "AWS variables, never the URL; default: the folder media under home",
    )

    result_storage: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9-]+/[a-z0-9-]+$",
        description="Prefect filesystem block (type-slug/name) for the item result cache; "
        "default: a local folder under home",
    )

    task_runner: Literal["threads", "dask"] = Field(
        default="threads",
        description="where the generate flow runs its item tasks: threads of the flow's "
        "process, or a Dask cluster (EPISODIC_DASK_ADDRESS) for many machines",
    )
    task_runner_threads: int = Field(
        default=64, ge=1, le=256, description="threads of the default task runner"
    )
    dask_address: str | None = Field(
        default=None,
        pattern=r"^(tcp|tls|inproc|ucx)://[A-Za-z0-9_.:\[\]-]{1,255}$",
        description="Dask scheduler address (tcp://host:8786); unset with task_runner=dask: "
        "a temporary local cluster per flow run",
    )

    max_run_cost: str = Field(
        default="25.00",
        description="per-run spending cap when neither --max-cost nor --max-images is given",
    )

    @field_validator("max_run_cost")
    @classmethod
    def _check_cap(cls, value: str) -> str:
        from episodic.core.money import parse_money

        try:
            parse_money(value)
        except InvalidInput as exc:
            raise ValueError(str(exc)) from None
        return value

    @property
    def max_run_cost_micros(self) -> int:
        from episodic.core.money import parse_money

        return parse_money(self.max_run_cost)

    @field_validator("home", mode="before")
    @classmethod
    def _empty_home_is_unset(cls, value: object) -> object:
        return default_home() if value == "" else value

    @field_validator("providers_file", mode="before")
    @classmethod
    def _providers_file(cls, value: object) -> object:
        """An empty EPISODIC_PROVIDERS_FILE is unset (the state folder's providers.yaml); a
        leading ``~`` is the user's home, as a shell would have expanded it."""
        if isinstance(value, str):
            if not value.strip():
                return None
            return Path(value).expanduser()
        return value

    @field_validator("home")
    @classmethod
    def _check_home(cls, value: Path) -> Path:
        """The absolute state folder (`core.home.resolve_home`: a relative value is anchored
        at the project folder), refused when it cannot be a folder, is blank or holds a
        control character."""
        if has_control_character(str(value)):
            raise ValueError("the value contains a control character")
        if not str(value).strip():
            raise ValueError("the value is blank (unset it for the default)")
        resolved = resolve_home(value)
        if len(str(resolved)) > MAX_HOME_CHARS:  # file paths under it are stored
            raise ValueError(f"the path is longer than {MAX_HOME_CHARS} characters")
        if resolved.exists() and not resolved.is_dir():
            raise ValueError(f"{value} exists and is not a directory")
        for parent in resolved.parents:  # the first existing ancestor
            if parent.exists():
                if not parent.is_dir():
                    raise ValueError(f"{value} cannot be created: {parent} is not a directory")
                break
        return resolved

    @field_validator("database_url")
    @classmethod
    def _check_database_url(cls, value: str | None) -> str | None:
        """A SQLite file by a relative path would follow the working directory (a cron job's
        empty ledger pays again): refused; the default ledger is inside the state folder."""
        found = _SQLITE_URL_RE.match(value or "")
        database = found.group(1) if found else ""
        if (
            database
            and not database.startswith(("/", ":memory:", "file:"))
            and not (
                re.match(r"[A-Za-z]:[\\/]", database)  # a Windows drive
            )
        ):
            raise ValueError(
                "a relative SQLite path follows the working directory: give the file's "
                "absolute path (sqlite:////absolute/episodic.db), or unset it for the state "
                "folder's ledger"
            )
        return value

    @field_validator("media_url")
    @classmethod
    def _check_media_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        from episodic.core.media import parse_store_url

        try:
            parse_store_url(value)
        except InvalidInput as exc:
            raise ValueError(str(exc)) from None
        return value

    @field_validator("timezone")
    @classmethod
    def _check_timezone(cls, value: str) -> str:
        load_timezone(value)
        return value

    @field_validator("pipeline")
    @classmethod
    def _check_pipeline(cls, value: str) -> str:
        return validate_pipeline(value)

    @cached_property
    def tz(self) -> ZoneInfo:
        return load_timezone(self.timezone)

    @property
    def timezone_explicit(self) -> bool:
        """True when EPISODIC_TIMEZONE was given (not the UTC default): it must then agree
        with the pipeline's recorded timezone (`episodic.pipeline.pipelines`)."""
        return "timezone" in self.model_fields_set

    @property
    def home_path(self) -> Path:
        """The state folder, absolute (the validator anchored it)."""
        return self.home

    @property
    def providers_path(self) -> Path:
        return self.providers_file or self.home_path / "providers.yaml"

    @property
    def results_path(self) -> Path:
        """The default result storage folder (when EPISODIC_RESULT_STORAGE is unset)."""
        return self.home_path / "results"

    @property
    def media_store_url(self) -> str:
        """The media store's URL: EPISODIC_MEDIA_URL, or the folder ``media`` under home."""
        return self.media_url or str(self.home_path / "media")

    @property
    def episodes_path(self) -> Path:
        return self.home_path / "episodes"

    def episode_folder(self, pipeline: str, episode_id: str) -> Path:
        """Where an episode's files live, scoped by pipeline: `episodes/{episode_id}` for the
        pipeline `weekly` (the layout that predates pipelines, kept so existing homes stay
        valid) and `episodes/pipelines/{pipeline}/{episode_id}` for every other one."""
        if pipeline == UNSCOPED_PIPELINE:
            return self.episodes_path / episode_id
        return self.episodes_path / "pipelines" / validate_pipeline(pipeline) / episode_id

    @property
    def url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.home_path / 'episodic.db'}"


def load_settings() -> Settings:
    """Settings from the environment; a bad value is an ``InvalidInput`` naming the variable."""
    project_folder()  # a bad EPISODIC_PROJECT_DIR is refused as itself, before what it anchors
    try:
        return Settings()
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else "?"
        message = str(first.get("ctx", {}).get("error", first["msg"]))
        raise InvalidInput(f"EPISODIC_{field.upper()}: {message}") from None
