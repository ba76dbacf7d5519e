"""A profile whose inputs ask the provider for several images a call is refused when the
providers file loads: Replicate's official models bill per output image (``num_outputs: 4``
is four images) and fal bills each of ``num_images``, while an item is one image, priced,
capped and stored as one. Every command that loads the profile (`plan`, `generate --plan`,
`generate`, `providers check`) says so in one line naming the profile and the input, exit 2,
and the stand-in receives no create and bills nothing. Counted at the stand-ins' side, through
the real `episodic` command on SQLite."""

from __future__ import annotations

import sqlite3
import subprocess
from pathlib import Path

import pytest

from episodic.core.exit_codes import ExitCode
from tests.integration.standin_cli import cli, fal_profile, planned, replicate_profile
from tests.standins import FalStandIn, ReplicateStandIn

pytestmark = pytest.mark.slow


def ledger(folder: Path) -> int:
    with sqlite3.connect(folder / "home" / "episodic.db") as db:
        row = db.execute("SELECT COALESCE(SUM(amount_micros), 0) FROM cost_entries").fetchone()
    return int(row[0])


def refused(done: subprocess.CompletedProcess[str], name: str, count: int) -> None:
    """One line, exit 2, naming the profile and the input; no traceback."""
    assert done.returncode == ExitCode.REFUSED, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "profile 'paid'" in lines[0] and f"{name}: {count}" in lines[0], lines


def test_replicate_num_outputs_above_one_is_refused_and_nothing_is_made(home: Path) -> None:
    """``num_outputs: 4`` would be billed 4 x 0.003 for the one image an item keeps: every
    command that loads the profile refuses it (exit 2) and the stand-in gets no create."""
    server = ReplicateStandIn(billing="per_output_image", price_micros=3_000)
    with server:
        episode = planned(home, replicate_profile(server, outputs=1), ["fox"])
        (home / "providers.yaml").write_text(
            "profiles:\n  paid:\n" + replicate_profile(server, outputs=4)
        )
        for done in (
            cli("generate", episode, "--max-cost", "0.005", "--plan"),
            cli("generate", episode, "--max-cost", "0.005"),
            cli("generate", episode),
            cli("providers", "check", "paid"),
        ):
            refused(done, "num_outputs", 4)
        assert server.create_calls == 0 and server.bill_micros == 0, server.bills
        assert ledger(home) == 0


def test_replicate_num_outputs_one_is_recorded_at_what_the_provider_bills(home: Path) -> None:
    """``num_outputs: 1`` is one image: the stand-in bills 0.003 and the ledger equals it."""
    server = ReplicateStandIn(billing="per_output_image", price_micros=3_000)
    with server:
        episode = planned(home, replicate_profile(server, outputs=1), ["fox"])
        done = cli("generate", episode)
        assert done.returncode == ExitCode.OK, done
        assert server.create_calls == 1 and server.bill_micros == 3_000, server.bills
        assert ledger(home) == server.bill_micros, done.stdout


def test_fal_num_images_above_one_is_refused_and_nothing_is_made(home: Path) -> None:
    """fal bills every image of ``num_images``: four images at one started megapixel each
    would be 0.10 for the one an item keeps; refused at load, and `plan` too."""
    server = FalStandIn(price_micros=25_000)
    with server:
        episode = planned(home, fal_profile(server, "{image_size: square, num_images: 1}"), ["fox"])
        (home / "providers.yaml").write_text(
            "profiles:\n  paid:\n" + fal_profile(server, "{image_size: square, num_images: 4}")
        )
        playlist = home / "pl" / "playlist.yaml"
        for done in (
            cli("plan", episode, "--playlist", str(playlist)),
            cli("generate", episode, "--max-cost", "0.05"),
            cli("generate", episode),
        ):
            refused(done, "num_images", 4)
        assert server.create_calls == 0 and server.bill_micros == 0, server.bills
