"""`episodic init`: the starter files of a project, written where the settings read them
(the providers file at ``EPISODIC_PROVIDERS_FILE``, default ``$EPISODIC_HOME/providers.yaml``;
a playlist skeleton for ``episodic plan --playlist``; the repository's ``prefect.yaml``, whose
deployments run episodic's installed flows on that playlist), never over an existing file.

The prices are the providers' published ones (read 2026-12): Replicate's
black-forest-labs/flux-schnell $0.003 and flux-dev $0.025 per output image; fal's
fal-ai/flux/schnell $0.003 and fal-ai/flux/dev $0.025 per megapixel, every started megapixel
billed (``whole_megapixels``). Check them against the providers' pages before a paid run.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from episodic.core.errors import InvalidInput

PROVIDERS_TEMPLATE = """\
# Provider profiles: which paid image API a playlist's `provider_profile` uses, and what an
# image costs there. Written by `episodic init`; format: docs/providers.md (Profiles).
# Editors validate this file with the JSON Schema of `episodic schema providers`.
#
# Credentials are never written here. Each profile names where its credential is read:
#   credential_env: REPLICATE_API_TOKEN     an environment variable of the shell or worker
#   credential_secret_block: replicate-token   a Prefect Secret block (needs PREFECT_API_URL)
# Replicate tokens: https://replicate.com/account/api-tokens; fal keys:
# https://fal.ai/dashboard/keys. Then `episodic providers check PROFILE` verifies the token,
# the model and every input name below without spending anything.
#
# Prices are decimal strings (quoted) in USD, the providers' published prices when this file
# was written: check them on the model's page before the first paid run.
profiles:
  replicate-flux-schnell:            # fast and cheap: $0.003 per image
    kind: replicate
    model: black-forest-labs/flux-schnell
    credential_env: REPLICATE_API_TOKEN
    # credential_secret_block: replicate-token   # instead of credential_env
    price: {per_image: "0.003"}
    max_concurrency: 4               # jobs in flight at once, every run and machine
    inputs: {aspect_ratio: "1:1", num_outputs: 1, output_format: png}
    prompt_input: prompt             # the model's name for the prompt
    seed_input: seed                 # the model's name for the seed (null: it takes none)

  replicate-flux-dev:                # better images: $0.025 per image
    kind: replicate
    model: black-forest-labs/flux-dev
    credential_env: REPLICATE_API_TOKEN
    price: {per_image: "0.025"}
    max_concurrency: 4
    inputs: {aspect_ratio: "1:1", num_outputs: 1, output_format: png}

  fal-flux-schnell:                  # $0.003 per started megapixel (1024x768: 1 MP)
    kind: fal
    model: fal-ai/flux/schnell
    credential_env: FAL_KEY
    price: {per_megapixel: "0.003", whole_megapixels: true, at_most: "1"}
    max_concurrency: 4
    inputs: {image_size: landscape_4_3, num_images: 1, output_format: png}

  fal-flux-dev:                      # $0.025 per started megapixel
    kind: fal
    model: fal-ai/flux/dev
    credential_env: FAL_KEY
    price: {per_megapixel: "0.025", whole_megapixels: true, at_most: "1"}
    max_concurrency: 4
    inputs: {image_size: landscape_4_3, num_images: 1, output_format: png}
"""

PLAYLIST_TEMPLATE = """\
# A playlist: what each episode generates. Written by `episodic init`; format:
# docs/playlist.md. Editors validate it with `episodic schema playlist`.
#   episodic allocate --key first --week 2026-W32   # an episode id, e.g. 2026-W32-0
#   episodic plan EPISODE_ID --playlist playlist.yaml
#   episodic generate EPISODE_ID --plan        # what it would buy, and the estimate
template:
  id: weekly-cover
  version: 1                         # raise it when you change the prompt
  prompt: "Cinematic cover art for the video '{title}', part {part}, soft light, no text"
# The profile of providers.yaml that buys the images (`fake`: free, local, for a dry run)
provider_profile: replicate-flux-schnell
items:
  - video_id: v01
    title: "Morning Harbor"
    seed: 1001
  - video_id: v02
    title: "Glass Forest"
    parts: [1, 2]                    # two images: part 1 and part 2
    seed: 1002
"""


# What a team's repository ignores (its .gitignore and .dockerignore): the state folder, one
# per machine, holding the ledger, the paid images and Prefect's home.
IGNORED = ".episodic/"
IGNORE_TEMPLATE = f"""\
# episodic's state folder (the ledger, paid images, Prefect's home): one per machine, never
# committed nor copied into an image (written by `episodic init`)
{IGNORED}
"""


@dataclass(frozen=True, slots=True)
class StarterFile:
    what: str  # "providers", "playlist", "prefect", "gitignore" or "dockerignore"
    path: Path
    written: bool  # False: it existed, and was kept as it is
    added: bool = False  # it existed, and the state folder's line was added to it

    def to_dict(self) -> dict[str, object]:
        status = "added" if self.added else "written" if self.written else "kept"
        return {"what": self.what, "path": str(self.path), "status": status}


def write_starter_files(
    providers: Path, playlist: Path, prefect: Path | None = None
) -> list[StarterFile]:
    """Write the providers file, the playlist skeleton and (with `prefect`, a path) the
    `prefect.yaml` of the repository where absent; an existing file (or one another process
    makes meanwhile) is kept. Raises `InvalidInput` when a path cannot be written (its folder
    is a file, no permission)."""
    targets = [("providers", providers), ("playlist", playlist)]
    ignores = []
    if prefect is not None:
        ignores = [(what, prefect.parent / f".{what}") for what in ("gitignore", "dockerignore")]
        targets += [("prefect", prefect), *ignores]
    for what, path in targets:  # what is there and is no file refuses before anything is written
        if path.is_symlink() or path.exists():
            _kept(what, path, f"{what} file {path}")
    existing = {path: _read_ignore(what, path) for what, path in ignores}  # readable, or refused
    files = [
        _write("providers", providers, PROVIDERS_TEMPLATE),
        _write("playlist", playlist, PLAYLIST_TEMPLATE),
    ]
    if prefect is not None:
        files.append(_write("prefect", prefect, prefect_yaml(prefect.parent, playlist)))
        files += [_ignore_state_folder(what, path, existing[path]) for what, path in ignores]
    return files


def _read_ignore(what: str, path: Path) -> str | None:
    """The text of an existing ignore file (None: there is none), or `InvalidInput` when it
    cannot be read as text (too large, not UTF-8): checked before anything is written."""
    from episodic.core.documents import DocumentError, read_text

    if not (path.is_symlink() or path.exists()):
        return None
    try:
        return read_text(path, max_bytes=1_000_000)
    except DocumentError as exc:
        raise InvalidInput(f"{what} file {path}: {exc}: nothing written") from None


def ignores_state_folder(text: str) -> bool:
    """Whether an ignore file's rules leave the state folder ignored: the last rule naming it
    decides (``.episodic/``, ``/.episodic`` ignore it; a negation ``!.episodic/...`` takes it
    back). Leading spaces are part of a rule, as git reads it; trailing ones are not."""
    name = IGNORED.strip("/")
    ignored = False
    for line in text.splitlines():
        rule = line.rstrip()
        if rule.strip("/") == name:
            ignored = True
        elif rule.startswith("!") and rule[1:].lstrip("/").split("/")[0] == name:
            ignored = False
    return ignored


def _ignore_state_folder(what: str, path: Path, text: str | None) -> StarterFile:
    """`path` (a repository's .gitignore or .dockerignore, whose text is `text`, None when
    absent) ignores the state folder: written when absent, kept when its rules already ignore
    it, else the line is added at its end (in the file's own line endings)."""
    if text is None:
        return _write(what, path, IGNORE_TEMPLATE)
    if ignores_state_folder(text):
        return StarterFile(what, path, written=False)
    newline = "\r\n" if "\r\n" in text else "\n"
    added = IGNORE_TEMPLATE.replace("\n", newline)
    try:
        with path.open("a", encoding="utf-8", newline="") as out:
            out.write((newline if text and not text.endswith("\n") else "") + added)
    except OSError as exc:
        raise InvalidInput(f"{what} file {path} cannot be written ({exc.strerror})") from None
    return StarterFile(what, path, written=True, added=True)


def prefect_yaml(repository: Path, playlist: Path) -> str:
    """The `prefect.yaml` of a team's repository: episodic's deployments (the checkout's
    `prefect.yaml`, the same steps and schedules) whose weekly playlist is `playlist`, named
    relative to `repository` when it is inside it (a worker resolves it in its own copy of
    the repository, `EPISODIC_PROJECT_DIR`), else by its absolute path."""
    template = (files("episodic.deployments") / "team_prefect.yaml").read_text(encoding="utf-8")
    where = Path(os.path.normpath(playlist.absolute()))  # `..` may leave the repository
    try:
        named = where.relative_to(os.path.normpath(repository.absolute())).as_posix()
    except ValueError:
        named = str(where)
    return template.replace("__PLAYLIST__", json.dumps(named))


def _write(what: str, path: Path, text: str) -> StarterFile:
    """Write `text` to the new file `path`; an existing regular file (or a symlink to one)
    is kept. Anything else there is refused (InvalidInput, exit 2), never reported kept: a
    folder (``--playlist .``), a dangling symlink (the loaders refuse it too), a device or
    FIFO; so is a path whose folder is a file or that cannot be written."""
    shown = f"{what} file {path}"
    if path.is_symlink() or path.exists():
        return _kept(what, path, shown)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # FileExistsError too: a file where its folder goes
        raise InvalidInput(
            f"{shown} cannot be written (its folder {path.parent}: {exc.strerror})"
        ) from None
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:  # another process made it meanwhile
        return _kept(what, path, shown)
    except OSError as exc:
        raise InvalidInput(f"{shown} cannot be written ({exc.strerror})") from None
    with os.fdopen(descriptor, "w", encoding="utf-8") as out:
        out.write(text)
    return StarterFile(what, path, written=True)


def _kept(what: str, path: Path, shown: str) -> StarterFile:
    """`path` exists: kept when it is a regular file (a symlink followed to one), else
    refused with one line saying what is there instead."""
    try:
        if path.is_file():
            return StarterFile(what, path, written=False)
        if path.is_symlink() and not path.exists():
            problem = f"is a symlink to a missing file ({os.readlink(path)})"
        elif path.is_dir():
            problem = "is a folder; name a file"
        else:
            problem = "is not a regular file (a device, FIFO or socket)"
    except OSError as exc:
        problem = f"cannot be read ({exc.strerror})"
    raise InvalidInput(f"{shown} {problem}: nothing written")
