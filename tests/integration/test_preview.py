"""`episodic preview`'s contact sheet, the titled cover and the form's titles, on SQLite and
Postgres: the reviewer sees what they approve."""

from __future__ import annotations

import hashlib
import io
import os
import stat
from pathlib import Path

import pytest
from PIL import Image
from sqlalchemy import Engine

from episodic.core.errors import CommandNotAllowed, EpisodeNotFound, ImageNotAsPaid, InvalidInput
from episodic.core.settings import load_settings
from episodic.pipeline import contact_sheet
from episodic.pipeline.approval import approval_context, decide, default_store
from episodic.pipeline.assembly import assemble
from episodic.pipeline.check import check_episodes
from episodic.pipeline.contact_sheet import ELLIPSIS
from episodic.pipeline.preview import preview
from episodic.storage.episodes import EpisodeRepository
from tests.generation import Episode, new_episode, store_file, write_playlist
from tests.media_targets import MediaTarget

LONG = "The very long title of a video about a journey that goes on and on and on and on"
TITLES = [LONG, "Привет, мир", "Hero *shot* | <b>x</b>"]


@pytest.fixture
def generated(engine: Engine, database_url: str, tmp_path: Path) -> Episode:
    """A generated episode: v01 (one part), v02 (two parts), v03 a hero run of 3."""
    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "p", TITLES, parts={2: [1, 2]}, hero={3: 3}))
    assert episode.generate().exit_code == 0
    return episode


def run_preview(episode: Episode, out: Path | None = None) -> dict[str, object]:
    engine = episode.engine
    return preview(
        engine,
        load_settings(),
        "weekly",
        episode.episode_id,
        store=default_store(None, engine),
        out=out,
    )


def test_preview_before_approval_shows_the_review_set_titled_with_heroes_in_one_row(
    generated: Episode,
) -> None:
    result = run_preview(generated)
    path = Path(str(result["path"]))
    assert path == load_settings().episode_folder("weekly", generated.episode_id) / "preview.png"
    assert path.is_absolute() and path.is_file()
    with Image.open(path) as sheet:
        assert sheet.format == "PNG"
        cell_w, cell_h = contact_sheet.PREVIEW_TILE.cell
        gap = contact_sheet.PREVIEW_TILE.gap
        assert sheet.size == (3 * cell_w + gap, 2 * cell_h + gap)  # 3 parts, then 3 heroes
    tiles = result["tiles"]
    assert isinstance(tiles, list)
    assert [(t["row"], t["column"], t["label"]) for t in tiles] == [
        (0, 0, "v01.p1"),
        (0, 1, "v02.p1"),
        (0, 2, "v02.p2"),
        (1, 0, "v03 candidate 1 (pick v03=1)"),
        (1, 1, "v03 candidate 2 (pick v03=2)"),
        (1, 2, "v03 candidate 3 (pick v03=3)"),
    ]
    titles = [t["title"] for t in tiles]
    assert titles[0].endswith(ELLIPSIS) and LONG.startswith(titles[0][:-1])
    assert titles[1:3] == ["Привет, мир"] * 2 and titles[3:] == [TITLES[2]] * 3
    assert result["heroes"] == {"v03": 3} and result["images"] == 6
    state = EpisodeRepository(generated.engine).state(
        EpisodeRepository(generated.engine).episode_pk("weekly", generated.episode_id)
    )
    assert state == "generated"  # a preview decides nothing


def test_preview_writes_where_out_says_and_again_the_same_bytes(
    generated: Episode, tmp_path: Path
) -> None:
    first = Path(str(run_preview(generated, tmp_path / "new" / "sheet.png")["path"]))
    assert first == tmp_path / "new" / "sheet.png"
    again = Path(str(run_preview(generated, first)["path"]))
    default = Path(str(run_preview(generated)["path"]))
    assert first.read_bytes() == again.read_bytes() == default.read_bytes()


def test_preview_out_has_normal_permissions_and_never_replaces_a_symlink(
    generated: Episode, tmp_path: Path
) -> None:
    """The sheet is a file like any other (0666 minus the umask, not a temporary file's
    0600); a symlink at --out is refused, one line, the link and its target kept."""
    old = os.umask(0o022)
    try:
        sheet = Path(str(run_preview(generated, tmp_path / "sheet.png")["path"]))
    finally:
        os.umask(old)
    assert stat.S_IMODE(sheet.stat().st_mode) == 0o644
    kept = tmp_path / "kept.png"
    kept.write_bytes(b"mine")
    link = tmp_path / "link.png"
    link.symlink_to(kept)
    with pytest.raises(InvalidInput, match=r"^--out .*symlink"):
        run_preview(generated, link)
    assert link.is_symlink() and kept.read_bytes() == b"mine"


def test_preview_is_refused_without_an_episode_a_plan_or_every_image(
    engine: Engine, database_url: str, tmp_path: Path
) -> None:
    with pytest.raises(EpisodeNotFound):
        run_preview(Episode(engine, "2026-W32-7"))
    episode = new_episode(engine)
    with pytest.raises(CommandNotAllowed, match="has no plan"):
        run_preview(episode)
    episode.plan(write_playlist(tmp_path / "p", ["a", "[[FAIL_PERMANENT]] b", "c"]))
    with pytest.raises(CommandNotAllowed, match=r"3 planned images are not completed \(v01.p1"):
        run_preview(episode)
    episode.generate()
    with pytest.raises(CommandNotAllowed, match=r"1 planned images are not completed \(v02.p1\)"):
        run_preview(episode)
    assert not load_settings().episode_folder("weekly", episode.episode_id).exists()


def test_preview_of_an_image_gone_from_the_store_is_refused_naming_it(
    generated: Episode,
) -> None:
    context = approval_context(generated.engine, "weekly", generated.episode_id)
    first = context.review_set()[0]
    assert first.key is not None
    store_file(first.key).unlink()
    with pytest.raises(ImageNotAsPaid, match=f"image v01.p1 \\({first.key}.* is missing"):
        run_preview(generated)


def test_the_preview_is_read_from_the_store_on_another_machine(
    media: MediaTarget, engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    episode = new_episode(engine)
    episode.plan(write_playlist(tmp_path / "p", ["a", "b"]))
    assert episode.generate().exit_code == 0
    monkeypatch.setenv("EPISODIC_HOME", str(tmp_path / "another-machine"))
    result = run_preview(episode)
    assert str(result["path"]).startswith(str(tmp_path / "another-machine"))
    assert [t["title"] for t in result["tiles"]] == ["a", "b"]  # type: ignore[union-attr]


def test_the_cover_is_titled_and_aspect_correct_and_an_old_cover_stays_on_reassembly(
    generated: Episode, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A cover assembled before titled covers (the untitled 128 px grid) is what the episode
    recorded: assembling it again changes nothing and `check` stays clean; an episode
    assembled now gets the titled cover."""
    engine, episode_id = generated.engine, generated.episode_id
    decide(engine, "weekly", episode_id, approve=True, by="ann", note=None, picks={"v03": 2})
    with monkeypatch.context() as patch:  # an assembly with the untitled cover
        patch.setattr(
            contact_sheet,
            "cover",
            lambda tiles: contact_sheet.untitled_cover([t.image for t in tiles]),
        )
        old = assemble(engine, load_settings(), "weekly", episode_id)
    again = assemble(engine, load_settings(), "weekly", episode_id)
    assert not again["changed"]
    assert (again["cover_sha256"], again["manifest_sha256"]) == (
        old["cover_sha256"],
        old["manifest_sha256"],
    )
    assert check_episodes(engine, "weekly") == []
    store = default_store(None, engine)
    with Image.open(io.BytesIO(store.read(str(old["cover"])))) as legacy:
        assert legacy.size == (2 * 128, 2 * 128)  # 4 shipped images, untitled squares
    other = new_episode(engine, key="test:2")
    other.plan(write_playlist(tmp_path / "p2", TITLES[:2]))
    assert other.generate().exit_code == 0
    decide(engine, "weekly", other.episode_id, approve=True, by="ann", note=None)
    new = assemble(engine, load_settings(), "weekly", other.episode_id)
    content = store.read(str(new["cover"]))
    assert hashlib.sha256(content).hexdigest() == new["cover_sha256"]
    size = contact_sheet.COVER_TILE
    with Image.open(io.BytesIO(content)) as cover:
        assert cover.size == (2 * size.cell[0] + size.gap, size.cell[1] + size.gap)
    assert check_episodes(engine, "weekly") == []


def test_the_approval_form_names_each_video_by_its_title_with_its_prompts_collapsed(
    generated: Episode,
) -> None:
    from episodic.flows.approval.form import approval_form_description

    context = approval_context(generated.engine, "weekly", generated.episode_id)
    markdown = approval_form_description(context)
    assert f"### {LONG} `v01`" in markdown
    assert "### Привет, мир `v02`" in markdown
    # people's text is escaped: no forged emphasis, table cell or HTML from a title
    assert r"### Hero \*shot\* \| \<b\>x\</b\> `v03`: pick one of 3 candidates" in markdown
    assert "| part 1 | ![v01.p1](data:image/jpeg;base64," in markdown
    assert "| candidate 2 | ![v03.c2](data:image/jpeg;base64," in markdown
    assert f"<p><code>v01.p1</code> cover for {LONG} part 1</p>" in markdown
    assert (
        "<details><summary>Prompt</summary><p><code>v03.c1, v03.c2, v03.c3</code> cover for "
        "Hero *shot* | &lt;b&gt;x&lt;/b&gt; part</p></details>"
    ) in markdown
    assert markdown.index("`v01`") < markdown.index("`v02`") < markdown.index("`v03`")
