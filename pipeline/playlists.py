"""Reading a playlist file, hashing its reference assets, recording it for an episode."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from episodic.core.documents import DocumentError, parse_yaml, read_text
from episodic.core.errors import InvalidPlaylist, PlaylistMistakes
from episodic.core.playlist import (
    MAX_REFERENCE_IMAGE_BYTES,
    PlannedItem,
    Playlist,
    canonical_json,
    expand,
    reference_image_type,
)
from episodic.core.playlist_errors import playlist_mistakes
from episodic.core.settings import load_settings
from episodic.providers.profiles import configured_profiles, load_profiles

MAX_PLAYLIST_BYTES = 5_000_000


def shown_path(path: Path) -> str:
    """A path as a message names it: a relative one with where it was looked for (the
    working directory of a worker's flow run is not the folder a person has in mind)."""
    return str(path) if path.is_absolute() else f"{path} (looked for {path.absolute()})"


def playlist_unreadable(path: Path) -> InvalidPlaylist | None:
    """Why the playlist file cannot be read at all (it does not exist, is not a regular file,
    is too large), naming where it was looked for; None when it can be. A run checks this
    before it allocates an episode (`episodic.flows.weekly`): a wrong path is found before a
    slot's episode exists."""
    try:
        read_text(path, max_bytes=MAX_PLAYLIST_BYTES)
    except DocumentError as exc:
        return InvalidPlaylist(f"playlist {shown_path(path)}: {exc}")
    return None


def load_playlist(path: Path) -> tuple[Playlist, list[str]]:
    """Parse and validate the YAML file; return it with the sha256 of each reference asset."""
    try:
        raw = parse_yaml(read_text(path, max_bytes=MAX_PLAYLIST_BYTES))
    except DocumentError as exc:
        raise InvalidPlaylist(f"playlist {shown_path(path)}: {exc}") from None
    playlist = parse_playlist(raw, str(path))
    references = []
    folder = path.parent.resolve()
    for name in playlist.reference_assets:
        if "\x00" in name or len(name) > 1024:
            raise InvalidPlaylist(
                f"{path}: reference asset names are paths of at most 1024 characters without NUL"
            )
        asset = (folder / name).resolve()  # symlinks resolved too
        if not asset.is_relative_to(folder):
            raise InvalidPlaylist(
                f"{path}: reference asset {name!r} is outside the playlist's folder"
            )
        try:
            if not asset.is_file():
                raise InvalidPlaylist(f"{path}: reference asset {name!r} does not exist")
            references.append(hashlib.sha256(asset.read_bytes()).hexdigest())
        except OSError as exc:
            raise InvalidPlaylist(
                f"{path}: reference asset cannot be read ({exc.strerror})"
            ) from None
    return playlist, references


def read_reference_image(
    path: Path, playlist: Playlist, references: list[str]
) -> tuple[str, str, bytes] | None:
    """The playlist's reference image as planned: (sha256, media type, bytes), read again
    and checked against the hash in the item keys; None when the playlist names none.
    Raises `InvalidPlaylist` (too large, changed while planning, unreadable)."""
    digest = playlist.reference_image_sha256(references)
    if digest is None or playlist.reference_image is None:
        return None
    asset = (path.parent.resolve() / playlist.reference_image).resolve()
    try:
        if asset.stat().st_size > MAX_REFERENCE_IMAGE_BYTES:
            raise InvalidPlaylist(
                f"{path}: reference_image is larger than "
                f"{MAX_REFERENCE_IMAGE_BYTES // (1024 * 1024)} MiB"
            )
        content = asset.read_bytes()
    except OSError as exc:
        raise InvalidPlaylist(f"{path}: reference_image cannot be read ({exc.strerror})") from None
    if hashlib.sha256(content).hexdigest() != digest:
        raise InvalidPlaylist(f"{path}: reference_image changed while it was being planned")
    media_type = reference_image_type(playlist.reference_image)
    assert media_type is not None  # the playlist's validator checked the suffix
    return digest, media_type, content


def parse_playlist(raw: Any, source: str) -> Playlist:
    try:
        return Playlist.model_validate(raw)
    except ValidationError as exc:
        raise PlaylistMistakes(source, playlist_mistakes(exc.errors(), raw)) from None


def check_profile_known(playlist: Playlist, source: str, providers_path: Path | None) -> None:
    """Refuse (`InvalidPlaylist`, exit 2) a playlist whose provider profile is none of
    `providers_path`'s (None: the settings', EPISODIC_PROVIDERS_FILE or the home's), naming
    it and the known ones: at `plan`, not first at `generate`."""
    settings = load_settings()
    if providers_path is None or providers_path == settings.providers_path:
        profiles = configured_profiles(settings)  # a named EPISODIC_PROVIDERS_FILE must exist
    else:  # a file the caller names must exist too
        profiles = load_profiles(providers_path, required=True)
    if playlist.provider_profile not in profiles:
        raise InvalidPlaylist(
            f"playlist {source}: provider_profile {playlist.provider_profile!r} is not a "
            f"provider profile (known: {', '.join(sorted(profiles))}; see "
            "`episodic providers list`)"
        )


def playlist_sha256(playlist: Playlist) -> str:
    """The playlist's hash. A field added later counts only when it is set, so a playlist
    that does not use it keeps the hash it was recorded with (planning it again changes
    nothing, and an approved episode's plan stays the same plan)."""
    dump = playlist.model_dump()
    for later in ("reference_image", "hero"):
        if dump[later] is None:
            del dump[later]
    for video in dump["items"]:
        if video["hero"] is None:
            del video["hero"]
    return hashlib.sha256(canonical_json(dump).encode()).hexdigest()


def planned_items(
    playlist: dict[str, Any], references: list[str], episode_id: str, pipeline: str
) -> list[PlannedItem]:
    """The recorded plan's paid images for one episode of one pipeline (keys scoped by both)."""
    return expand(parse_playlist(playlist, "recorded plan"), references, episode_id, pipeline)
