"""Bad input in FILES: malformed playlists (`episodic plan`), legacy layouts
(`episodic migrate-legacy`) and provider profiles (`providers.yaml`, read by `generate`).

Each file is a valid one with one field replaced by a nasty value (wrong types, NaN/inf,
huge and negative numbers, non-ASCII digits, NUL bytes, 10 KB strings, markup, deep nesting,
path traversal), or raw garbage (invalid YAML/JSON, binary, duplicate keys, empty), or not a
file at all (a folder, a FIFO, a missing path). Always: exit 0 or 2, one line on stderr, no
traceback, nothing "unexpected"; refused means nothing written (no row, no file) and no path
escapes its folder. The CLI runs in this process (`episodic.cli.app.run`), on SQLite and Postgres.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st
from sqlalchemy import Engine, func, select

import episodic.storage.models  # noqa: F401  (every table registered on Base.metadata)
from episodic.cli.app import run
from episodic.core.ids import WeekId
from episodic.pipeline.allocation import allocate
from episodic.storage.base import Base
from tests.generation import write_playlist
from tests.property import fuzz_settings

TABLES = Base.metadata.sorted_tables  # every table of the schema
FUZZ = fuzz_settings(60)


def _nested(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = [value]
    return value


DEEP = _nested(100)  # deeper than any format of ours; a parser's recursion limit is not
# Values a field should never accept, or accept only as what they are.
NASTY_VALUES: list[Any] = [
    "",
    " ",
    "x" * 10_000,
    "a\x00b",
    "\x1b[31mred",
    "\u202eevil",
    "[bold red]boom[/]",
    "{title!r:>99999}",
    "../../etc/passwd",
    "/etc/passwd",
    "\u0661\u0662",
    "\uff11",
    "1e999",
    "nan",
    float("nan"),
    float("inf"),
    float("-inf"),
    -1,
    0,
    1.5,
    1.0,
    10**30,
    -(10**30),
    2**63,
    True,
    None,
    [],
    {},
    {"a": 1},
    ["x"],
    DEEP,
]
NASTY = st.sampled_from(NASTY_VALUES) | st.text(max_size=20) | st.integers()

# Raw file contents that are not a document of ours at all.
RAW: list[bytes] = [
    b"",
    b"\x00",
    b"\xff\xfe\x00\x01garbage",
    bytes(range(256)),
    b"[" * 5000,
    b"{" * 5000,
    b"a: " + b"[" * 200 + b"]" * 200,
    b"a: &a [*a]",
    b"a: &a {b: *a}",
    b"a: b: c",
    b"- - - -",
    b"template: 1\ntemplate: 2\n",
    b"!!python/object/apply:os.system ['touch /tmp/pwned']",
    b'{"schema": 1, "schema": 1}',
    b'"just a string"',
    b"NaN",
    b"[1, 2, 3]",
    b"%YAML 9.9\n---\na: 1",
    b"\xef\xbb\xbf{}",
]


def counts(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {
            t.name: conn.execute(select(func.count()).select_from(t)).scalar_one() for t in TABLES
        }


def files_under(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*") if not p.name.startswith("episodic.db")}


def answer(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = run(argv)
    out, err = capsys.readouterr()
    assert "Traceback (most recent call last)" not in out + err, (argv, err)
    assert "unexpected" not in err, (argv, err)
    assert code in (0, 2), (argv, code, err)
    if code:
        lines = err.strip().splitlines()
        if len(lines) > 1:  # a playlist's several mistakes: the header, then one a line
            assert re.fullmatch(r"error: playlist .*: \d+ mistakes:", lines[0]), err[:2000]
            assert len(lines) - 1 == int(lines[0].rsplit(" ", 2)[-2]), err[:2000]
            assert all(line.startswith("  ") and len(line) < 600 for line in lines[1:]), err
        assert lines[0].startswith("error: "), (argv, err[:2000])
        assert len(lines[0]) < 600
    return code, err


def mutate(document: Any, path: tuple[Any, ...], value: Any) -> Any:
    """A deep copy of `document` with the value at `path` replaced (or the key added)."""
    copy = json.loads(json.dumps(document))
    if not path:
        return value
    target = copy
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return copy


def write_yaml(path: Path, data: Any) -> None:
    path.write_text(yaml.safe_dump(data, allow_unicode=True, width=10**6))


def not_a_file(kind: str, path: Path) -> None:
    if kind == "folder":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "dangling symlink":
        path.symlink_to(path.parent / "nowhere")
    elif kind == "symlink loop":
        path.symlink_to(path)
    elif kind == "too large":
        with path.open("wb") as handle:
            handle.truncate(6_000_000)


NOT_FILES = ["folder", "fifo", "dangling symlink", "symlink loop", "too large", "missing"]


def clear(path: Path) -> None:
    if path.is_symlink() or path.is_file() or path.is_fifo():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


# --- playlists ----------------------------------------------------------------------------

PLAYLIST_FIELDS: list[tuple[Any, ...]] = [
    (),
    ("template",),
    ("template", "id"),
    ("template", "version"),
    ("template", "prompt"),
    ("template", "extra"),
    ("provider_profile",),
    ("reference_assets",),
    ("reference_assets", 0),
    ("items",),
    ("items", 0),
    ("items", 0, "video_id"),
    ("items", 0, "title"),
    ("items", 0, "parts"),
    ("items", 0, "parts", 0),
    ("items", 0, "seed"),
    ("items", 0, "extra"),
    ("items", 1, "hero"),
    ("items", 1, "hero", "candidates"),
    ("items", 1, "hero", "extra"),
    ("hero",),
    ("extra",),
]


@pytest.fixture
def planning(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Engine, Path, dict[str, Any]]:
    """An allocated episode and a valid playlist (one reference asset) to start from."""
    monkeypatch.chdir(tmp_path)
    allocate(engine, "weekly", WeekId.parse("2026-W32"), "fuzz")
    folder = tmp_path / "pl"
    valid = write_playlist(
        folder, ["a", "b"], references={"style.txt": "ok"}, parts={1: [1, 2]}, hero={2: 3}
    )
    (tmp_path / "secret.txt").write_text("not yours")
    return engine, folder, yaml.safe_load(valid.read_text())


def plan_file(
    planning: tuple[Engine, Path, dict[str, Any]],
    capsys: pytest.CaptureFixture[str],
    write: Callable[[Path], None],
) -> tuple[int, str]:
    engine, folder, _ = planning
    target = folder / "fuzz.yaml"
    clear(target)
    write(target)
    before, files = counts(engine), files_under(folder.parent)
    code, err = answer(["plan", "2026-W32-0", "--playlist", str(target)], capsys)
    if code:
        assert counts(engine) == before, err
    assert files_under(folder.parent) == files  # a plan writes no file, accepted or not
    return code, err


@FUZZ
@given(field=st.sampled_from(PLAYLIST_FIELDS), value=NASTY)
@example(field=("reference_assets", 0), value="../secret.txt")
@example(field=("reference_assets", 0), value="/etc/passwd")
@example(field=("reference_assets", 0), value="x" * 10_000)
@example(field=("items", 0, "seed"), value=float("nan"))
@example(field=("items", 0, "seed"), value=True)
@example(field=("items", 0, "parts", 0), value=10**30)
@example(field=("template", "prompt"), value="{title!r:>99999}")
@example(field=(), value=DEEP)
def test_a_playlist_with_a_nasty_field_is_refused_in_one_line_or_taken_as_it_is(
    planning: tuple[Engine, Path, dict[str, Any]],
    capsys: pytest.CaptureFixture[str],
    field: tuple[Any, ...],
    value: Any,
) -> None:
    data = mutate(planning[2], field, value)
    plan_file(planning, capsys, lambda path: write_yaml(path, data))


@FUZZ
@given(content=st.sampled_from(RAW) | st.binary(max_size=200))
# Pinned: deep nesting (never "unexpected RecursionError", exit 1), and a key given twice
# (never silently taken as its last value: the plan would say what the file does not).
@example(content=b"[" * 5000)
@example(content=b"a: " + b"{" * 5000)
@example(
    content=b"template: {id: a, version: 1, prompt: x}\ntemplate: {id: b, version: 1, prompt: y}\n"
    b"items: [{video_id: v, title: t, seed: 1}]\n"
)
def test_a_playlist_that_is_not_yaml_of_ours_is_refused_in_one_line(
    planning: tuple[Engine, Path, dict[str, Any]],
    capsys: pytest.CaptureFixture[str],
    content: bytes,
) -> None:
    code, _ = plan_file(planning, capsys, lambda path: path.write_bytes(content))
    assert code == 2


def test_duplicate_keys_in_a_playlist_are_refused_not_taken_as_the_last(
    planning: tuple[Engine, Path, dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    text = (
        "template: {id: a, version: 1, prompt: x}\n"
        "items:\n  - {video_id: v, title: t, seed: 1, seed: 2}\n"
    )
    code, err = plan_file(planning, capsys, lambda path: path.write_text(text))
    assert code == 2 and "'seed' appears twice" in err and "line 3" in err


@pytest.mark.parametrize("kind", NOT_FILES)
def test_a_playlist_path_that_is_not_a_readable_file_is_refused_in_one_line(
    planning: tuple[Engine, Path, dict[str, Any]], capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    code, err = plan_file(planning, capsys, lambda path: not_a_file(kind, path))
    assert code == 2 and "fuzz.yaml" in err


# --- legacy layouts -----------------------------------------------------------------------

LEGACY_FIELDS: list[tuple[Any, ...]] = [
    (),
    ("schema",),
    ("week_id",),
    ("completed_at",),
    ("approval",),
    ("approval", "state"),
    ("approval", "by"),
    ("approval", "at"),
    ("approval", "note"),
    ("images",),
    ("images", 0),
    ("images", 0, "video_id"),
    ("images", 0, "part"),
    ("images", 0, "file"),
    ("images", 0, "sha256"),
    ("images", 0, "remote_ref"),
    ("images", 0, "cost_minor"),
    ("images", 0, "currency"),
    ("images", 0, "completed_at"),
    ("images", 0, "extra"),
    ("media",),
    ("media", "cover"),
    ("media", "cover", "file"),
    ("media", "poster"),
    ("extra",),
]


def tiny_png(shade: int) -> bytes:
    """A real 4x4 PNG of one shade: the same bytes for the same shade (legacy files are
    images; the import proves each before storing it)."""
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (4, 4), (shade, shade, shade)).save(buffer, format="PNG")
    return buffer.getvalue()


def legacy_state(folder: Path) -> dict[str, Any]:
    (folder / "images").mkdir(parents=True)
    images = []
    for n in (1, 2):
        data = tiny_png(n)
        (folder / "images" / f"v{n}.png").write_bytes(data)
        images.append(
            {
                "video_id": f"v{n}",
                "part": 1,
                "file": f"images/v{n}.png",
                "sha256": hashlib.sha256(data).hexdigest(),
                "remote_ref": f"pred_{folder.name}_{n}",
                "cost_minor": 5,
                "currency": "USD",
                "completed_at": "2026-07-20T09:30:00Z",
            }
        )
    cover = tiny_png(200)
    (folder / "cover.png").write_bytes(cover)
    return {
        "schema": 1,
        "week_id": folder.name,
        "completed_at": "2026-07-20T09:30:00Z",
        "approval": {"state": "approved", "by": "ann", "at": "2026-07-21T10:00:00Z"},
        "images": images,
        "media": {"cover": {"file": "cover.png", "sha256": hashlib.sha256(cover).hexdigest()}},
    }


@pytest.fixture
def legacy(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Engine, Path, dict[str, Any]]:
    """A legacy root with one valid week (2026-W30); each example rewrites 2026-W31."""
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "legacy"
    valid = legacy_state(root / "2026-W30")
    (root / "2026-W30" / "state.json").write_text(json.dumps(valid))
    (tmp_path / "secret.png").write_bytes(tiny_png(1))  # same bytes as a valid image
    return engine, root, legacy_state(root / "2026-W31")


def migrate_file(
    legacy: tuple[Engine, Path, dict[str, Any]],
    capsys: pytest.CaptureFixture[str],
    write: Callable[[Path], None],
) -> tuple[int, str]:
    engine, root, _ = legacy
    target = root / "2026-W31" / "state.json"
    clear(target)
    write(target)
    home = Path(os.environ["EPISODIC_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    before, files, sources = counts(engine), files_under(home), files_under(root)
    code, err = answer(["migrate-legacy", str(root), "--apply"], capsys)
    if code:
        assert counts(engine) == before, err
        assert files_under(home) == files, err
    assert files_under(root) == sources  # the legacy tree is only read
    for copied in files_under(home):  # whatever was imported stayed in the episode folders
        assert copied.resolve().is_relative_to(home.resolve())
    return code, err


@FUZZ
@given(field=st.sampled_from(LEGACY_FIELDS), value=NASTY)
# Pinned: a file name with a NUL byte or of 10 KB (never "unexpected ValueError/OSError");
# a huge part or cost, or a NUL in a remote ref or note, refused before the episode is
# allocated (not a database error inside the import, exit 1, an empty episode left).
@example(field=("images", 0, "file"), value="a\x00b")
@example(field=("images", 0, "file"), value="x" * 10_000)
@example(field=("images", 0, "file"), value="../../2026-W30/images/v1.png")
@example(field=("images", 0, "file"), value="../../secret.png")
@example(field=("images", 0, "part"), value=10**30)
@example(field=("images", 0, "part"), value=True)
@example(field=("images", 0, "cost_minor"), value=10**30)
@example(field=("images", 0, "cost_minor"), value=1.0)
@example(field=("images", 0, "remote_ref"), value="a\x00b")
@example(field=("approval", "note"), value="a\x00b")
@example(field=("images", 0, "completed_at"), value="2026-07-20T09:30:00")
@example(field=("images", 1, "video_id"), value="v1")  # v1 part 1 twice
@example(field=("images", 0, "remote_ref"), value="pred_2026-W30_1")  # another week's job
@example(field=("schema",), value=True)
def test_a_legacy_state_with_a_nasty_field_is_refused_before_anything_is_written(
    legacy: tuple[Engine, Path, dict[str, Any]],
    capsys: pytest.CaptureFixture[str],
    field: tuple[Any, ...],
    value: Any,
) -> None:
    data = mutate(legacy[2], field, value)
    migrate_file(legacy, capsys, lambda path: path.write_text(json.dumps(data)))


@FUZZ
@given(content=st.sampled_from(RAW) | st.binary(max_size=200))
@example(content=b"[" * 100_000)  # found: "unexpected RecursionError"
@example(content=b'{"schema": 1, "schema": 1}')
@example(content=b'{"cost_minor": NaN}')
def test_a_legacy_state_that_is_not_json_of_ours_is_refused_in_one_line(
    legacy: tuple[Engine, Path, dict[str, Any]],
    capsys: pytest.CaptureFixture[str],
    content: bytes,
) -> None:
    code, _ = migrate_file(legacy, capsys, lambda path: path.write_bytes(content))
    assert code == 2


@pytest.mark.parametrize("kind", NOT_FILES)
def test_a_legacy_state_that_is_not_a_readable_file_is_refused_in_one_line(
    legacy: tuple[Engine, Path, dict[str, Any]], capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    code, err = migrate_file(legacy, capsys, lambda path: not_a_file(kind, path))
    assert code == 2 and "state.json" in err


def test_a_provider_job_imported_from_another_tree_is_not_imported_again(
    legacy: tuple[Engine, Path, dict[str, Any]],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    engine, root, _ = legacy
    shutil.rmtree(root / "2026-W31")
    assert answer(["migrate-legacy", str(root), "--apply"], capsys)[0] == 0
    other = tmp_path / "other"
    copied = legacy_state(other / "2026-W33")
    copied["images"][0]["remote_ref"] = "pred_2026-W30_1"  # a job the first import recorded
    (other / "2026-W33" / "state.json").write_text(json.dumps(copied))
    before = counts(engine)
    code, err = answer(["migrate-legacy", str(other), "--apply"], capsys)
    assert code == 2 and "already recorded" in err and counts(engine) == before


# --- provider profiles --------------------------------------------------------------------

PROFILE_FIELDS: list[tuple[Any, ...]] = [
    (),
    ("profiles",),
    ("profiles", "mine"),
    ("profiles", "mine", "kind"),
    ("profiles", "mine", "cost_per_image_minor"),
    ("profiles", "mine", "currency"),
    ("profiles", "mine", "max_concurrency"),
    ("profiles", "mine", "base_url"),
    ("profiles", "mine", "credential_env"),
    ("profiles", "mine", "credential_secret_block"),
    ("profiles", "mine", "timeout_s"),
    ("profiles", "mine", "poll_interval_s"),
    ("profiles", "mine", "max_job_s"),
    ("profiles", "mine", "delay_ms"),
    ("profiles", "mine", "idempotent_create"),
    ("profiles", "mine", "lookup"),
    ("profiles", "mine", "extra"),
    ("extra",),
]
VALID_PROFILES = {
    "profiles": {
        "mine": {
            "kind": "http",
            "base_url": "http://127.0.0.1:9/v1",
            "credential_env": "FUZZ_TOKEN",
            "cost_per_image_minor": 5,
            "currency": "USD",
            "max_concurrency": 4,
            "timeout_s": 30,
            "poll_interval_s": 1,
            "max_job_s": 60,
            "idempotent_create": False,
            "lookup": True,
        }
    }
}


@pytest.fixture
def profiled(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Engine, Path]:
    """A planned episode whose playlist names the profile `mine` of EPISODIC_PROVIDERS_FILE."""
    monkeypatch.chdir(tmp_path)
    profiles = tmp_path / "providers.yaml"
    monkeypatch.setenv("EPISODIC_PROVIDERS_FILE", str(profiles))
    # plan refuses a profile it does not know: `mine` exists when planned; each example
    # then writes its own file over it
    profiles.write_text("profiles:\n  mine:\n    kind: fake\n    cost_per_image_minor: 4\n")
    allocate(engine, "weekly", WeekId.parse("2026-W32"), "fuzz")
    playlist = write_playlist(tmp_path / "pl", ["a"], profile="mine")
    assert run(["plan", "2026-W32-0", "--playlist", str(playlist)]) == 0
    return engine, profiles


def generate_plan(
    profiled: tuple[Engine, Path],
    capsys: pytest.CaptureFixture[str],
    write: Callable[[Path], None],
) -> tuple[int, str]:
    engine, profiles = profiled
    clear(profiles)
    write(profiles)
    before = counts(engine)
    code, err = answer(["generate", "2026-W32-0", "--plan"], capsys)
    assert counts(engine) == before  # --plan writes nothing, accepted or not
    return code, err


@FUZZ
@given(field=st.sampled_from(PROFILE_FIELDS), value=NASTY)
# Pinned: `delay_ms: 1e400`-sized integers (the fake provider would overflow),
# `timeout_s: true` (not 1 s) and `lookup: "yes"` (not true) are refused.
@example(field=("profiles", "mine", "delay_ms"), value=10**400)
@example(field=("profiles", "mine", "timeout_s"), value=True)
@example(field=("profiles", "mine", "timeout_s"), value=float("nan"))
@example(field=("profiles", "mine", "lookup"), value="yes")
@example(field=("profiles", "mine", "cost_per_image_minor"), value=10**30)
@example(field=("profiles",), value=[1, 2])
@example(field=("profiles", "mine"), value=DEEP)
def test_a_profile_with_a_nasty_field_is_refused_in_one_line_or_taken_as_it_is(
    profiled: tuple[Engine, Path],
    capsys: pytest.CaptureFixture[str],
    field: tuple[Any, ...],
    value: Any,
) -> None:
    data = mutate(VALID_PROFILES, field, value)
    generate_plan(profiled, capsys, lambda path: write_yaml(path, data))


@FUZZ
@given(content=st.sampled_from(RAW) | st.binary(max_size=200))
# Pinned: deep nesting (never "unexpected RecursionError"), bytes that are not UTF-8 (never
# "unexpected UnicodeDecodeError") and a folder at the path (never "unexpected
# IsADirectoryError").
@example(content=b"[" * 5000)
@example(content=b"\xff\xfe")
@example(content=b"profiles: {mine: {kind: http}, mine: {kind: fake}}")
@example(content=b"profiles: {1: {kind: fake, cost_per_image_minor: 1}}")
def test_a_profiles_file_that_is_not_yaml_of_ours_is_refused_in_one_line(
    profiled: tuple[Engine, Path], capsys: pytest.CaptureFixture[str], content: bytes
) -> None:
    code, _ = generate_plan(profiled, capsys, lambda path: path.write_bytes(content))
    assert code == 2


@pytest.mark.parametrize("kind", [k for k in NOT_FILES if k != "missing"])
def test_a_profiles_path_that_is_not_a_readable_file_is_refused_in_one_line(
    profiled: tuple[Engine, Path], capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    code, err = generate_plan(profiled, capsys, lambda path: not_a_file(kind, path))
    # EPISODIC_PROVIDERS_FILE names the file: a path that leads to no file is refused, named
    assert code == 2 and "providers.yaml" in err and err.count("\n") == 1
