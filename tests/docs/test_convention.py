"""The documented-commands convention itself: what a block is, when it fails, what carries
over from block to block. Real bash processes on a tiny project folder; no Prefect server
(the address is only substituted, never called)."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
import typer.main

from episodic.cli.app import app
from tests.docs.blocks import Block, convention_errors, shell_blocks, synopsis_errors
from tests.docs.session import SESSION_TOKEN_VAR, BlockResult, FileSession
from tests.e2e.stack import pids_with_env

API = "http://127.0.0.1:54321/api"


def _doc(tmp_path: Path, text: str) -> list[Block]:
    project = tmp_path / "project"
    (project / "docs").mkdir(parents=True, exist_ok=True)
    (project / "docs" / "page.md").write_text(textwrap.dedent(text))
    return shell_blocks(project, "docs/page.md")


def _run(tmp_path: Path, text: str) -> tuple[FileSession, list[Block], list[BlockResult]]:
    blocks = _doc(tmp_path, text)
    session = FileSession(
        "docs/page.md", tmp_path / "project", tmp_path / "work", API, up_seconds=1.0
    )
    results = [session.run_through(blocks, b) for b in blocks if b.runnable]
    return session, blocks, results


def test_shell_fences_markers_and_console_prompts(tmp_path: Path) -> None:
    blocks = _doc(
        tmp_path,
        """\
        # Page

        ```yaml
        not: shell
        ```

        ```sh
        echo one   # exit 0
        echo two \\
          continued
        ```

        <!-- illustration: needs a real token -->
        ```bash
        episodic providers check real
        ```

        ```console
        $ echo three
        three
        ```
        """,
    )
    assert [(b.line, b.language, b.illustration) for b in blocks] == [
        (7, "sh", None),
        (14, "bash", "needs a real token"),
        (18, "console", None),
    ]
    assert [(c.line, c.text) for c in blocks[0].commands()] == [
        (8, "echo one   # exit 0"),
        (9, "echo two continued"),
    ]
    assert [c.text for c in blocks[2].commands()] == ["echo three"]  # output lines are not run


def test_a_fence_inside_a_list_item_is_a_block_too(tmp_path: Path) -> None:
    blocks = _doc(
        tmp_path,
        """\
        1. **Deploy**:

           ```sh
           episodic prefect setup --work-pool episodic
           ```
        """,
    )
    assert [(b.line, b.body, b.runnable) for b in blocks] == [
        (3, "episodic prefect setup --work-pool episodic", True)
    ]


def test_a_failing_command_names_its_line_and_exit(tmp_path: Path) -> None:
    _, _, results = _run(
        tmp_path,
        """\
        ```sh
        true
        sh -c 'exit 3'
        echo never
        ```
        """,
    )
    (result,) = results
    assert not result.ok
    assert result.failures == ["docs/page.md:3: exited 3, expected 0: sh -c 'exit 3'"]
    assert "never" not in result.output


def test_an_expected_exit_is_exact_and_pipelines_fail_on_any_command(tmp_path: Path) -> None:
    _, _, results = _run(
        tmp_path,
        """\
        ```sh
        sh -c 'exit 2'   # exit 2: refused
        ```

        ```sh
        true             # exit 5
        ```

        ```sh
        false | cat
        ```
        """,
    )
    assert [r.ok for r in results] == [True, False, False]
    assert results[1].failures == [
        "docs/page.md:6: exited 0, expected 5: true             # exit 5"
    ]
    assert "exited 1" in results[2].failures[0]


def test_cwd_and_exports_carry_over_plain_variables_do_not(tmp_path: Path) -> None:
    _, _, results = _run(
        tmp_path,
        """\
        ```sh
        mkdir -p sub && cd sub
        export CARRIED=yes
        PLAIN=yes
        ```

        ```sh
        test "$CARRIED" = yes
        test -z "$PLAIN"
        test "$(basename "$PWD")" = sub
        test -d ../docs          # in the copy of the project
        ```
        """,
    )
    assert [r.ok for r in results] == [True, True], results[1].describe()


def test_the_machine_is_fresh_and_the_default_prefect_address_is_the_tests(tmp_path: Path) -> None:
    os.environ["EPISODIC_SHOULD_NOT_LEAK"] = "1"
    try:
        session, _, results = _run(
            tmp_path,
            """\
            ```sh
            test "$(echo http://127.0.0.1:4200/api)" = "$PREFECT_API_URL"
            test -z "$EPISODIC_SHOULD_NOT_LEAK"
            test "$HOME" != "$PWD" && test -z "$(ls -A "$HOME")"
            ```
            """,
        )
    finally:
        del os.environ["EPISODIC_SHOULD_NOT_LEAK"]
    assert results[0].ok, results[0].describe()
    assert session.copy != tmp_path / "project" and (session.copy / "docs" / "page.md").exists()


def test_runs_until_stopped_must_come_up_and_is_stopped_with_its_block(tmp_path: Path) -> None:
    session, _, results = _run(
        tmp_path,
        """\
        ```sh
        sleep 600 &      # runs until stopped
        echo after
        ```

        ```sh
        sh -c 'exit 4'   # runs until stopped
        echo not reached
        ```

        ```sh
        sleep 600 &
        ```
        """,
    )
    up, dies, unmarked = results
    assert up.ok, up.describe()
    assert "after" in up.output
    assert not pids_with_env(SESSION_TOKEN_VAR, session.token)  # stopped with its block
    assert not dies.ok and "did not come up" in dies.failures[0]
    assert "not reached" not in dies.output
    assert not unmarked.ok
    assert "# runs until stopped" in unmarked.failures[0]


def test_a_service_that_dies_inside_its_block_fails_it(tmp_path: Path) -> None:
    _, _, results = _run(
        tmp_path,
        """\
        ```sh
        sleep 600                       # runs until stopped
        sh -c 'sleep 2; exit 5' &       # runs until stopped
        sleep 4
        ```
        """,
    )
    (result,) = results
    assert not result.ok
    assert result.failures == ["docs/page.md:3: exited 5 before the block stopped it"], (
        result.describe()
    )


def test_an_illustration_must_say_why(tmp_path: Path) -> None:
    (bare,) = _doc(tmp_path, "<!-- illustration -->\n```sh\nepisodic demo\n```\n")
    assert convention_errors(bare) == [
        "docs/page.md:2: an illustration marker must say why the block cannot run"
    ]


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ("episodic generate E [--only 3] [--bogus]", "`generate` has no option --bogus"),
        ("episodic runs list | runs shw RUN_ID", "`episodic runs shw`: no such command"),
        ("episodic prefect setup --work-pol episodic", "`setup` has no option --work-pol"),
        ("episodic sweep [--prefect/--no-prefects]", "`sweep` has no option --no-prefects"),
        ("episodic check E | --all [--jsn]", "`check` has no option --jsn"),
        ("episodic generate E \\\n      [--max-cost 5] [--nope N]", "no option --nope"),
    ],
)
def test_an_illustration_names_only_real_commands_and_options(line: str, error: str) -> None:
    block = Block("docs/page.md", 1, "sh", line, "synopsis")
    errors = synopsis_errors(block, typer.main.get_command(app))
    assert len(errors) == 1 and error in errors[0], errors


def test_a_synopsis_of_real_commands_passes() -> None:
    block = Block(
        "docs/page.md",
        1,
        "sh",
        "episodic generate E [--only 3,7-9] [--max-cost 5.00] \\\n"
        "                    [--idempotency-key K | --allow-duplicate | --batch-id B]\n"
        "episodic runs list [--episode E] | runs show RUN_ID\n"
        "episodic dispatch generate|approve|assemble E [--json]\n"
        "make demo --not-ours   # another program: not checked\n",
        "synopsis",
    )
    assert synopsis_errors(block, typer.main.get_command(app)) == []
