"""The shell blocks of README.md and docs/*.md, and what "runs as written" means for each.

The convention (docs/cli.md, "Documentation is tested", says the same for readers):

- A shell block is a fenced block whose info string is ``sh``, ``bash``, ``shell`` or
  ``console``. In a ``console`` block the lines that start with ``$ `` are the commands; the
  other lines are their output and are not compared. Other fences (``yaml``, ``json``, none)
  are not run.
- ``<!-- illustration: WHY -->`` on the line directly above the fence marks the block as an
  illustration: not run, and WHY (why it cannot run: a synopsis, a real token, apt) is
  required. Every ``episodic`` command such a block names must still exist with every
  ``--option`` it shows (checked against the command tree, so a synopsis cannot drift).
- Every other shell block runs. One command is one line, ``\\`` continuations joined. It
  fails the block when it exits non-zero, unless its comment starts with ``exit N``
  (``episodic episodes show 2026-W99-0   # exit 5``): then it must exit exactly N.
- A command whose comment starts with ``runs until stopped`` (a trailing ``&`` before it is
  allowed, not required) is started in the background, must come up (``prefect server
  start``: its ``/api/health`` answers; anything else: still running after a few seconds),
  and is stopped (SIGINT, then SIGKILL) when its block ends. A ``&`` without that comment is
  refused: nothing may outlive its block unnoticed.

This module is plain parsing; ``tests/docs/session.py`` runs what it finds.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

SHELL_LANGUAGES = frozenset({"sh", "bash", "shell", "console"})

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`\s]*)")
_MARKER = re.compile(r"^\s*<!--\s*illustration\s*(?::\s*(?P<why>.*?))?\s*-->\s*$")
_EXIT = re.compile(r"^exit\s+(?P<code>\d{1,3})\b")
_UNTIL_STOPPED = re.compile(r"^runs until stopped\b")


@dataclass(frozen=True)
class Command:
    """One command of a block: the text bash runs and what the doc says about it."""

    line: int  # 1-based line of the file where the command starts
    text: str  # as written (continuations joined), comment included
    expected_exit: int = 0
    until_stopped: bool = False

    @property
    def code(self) -> str:
        """The command without its comment (and without a trailing ``&``)."""
        code, _ = split_comment(self.text)
        code = code.rstrip()
        return code[:-1].rstrip() if code.endswith("&") and not code.endswith("&&") else code

    @property
    def backgrounded(self) -> bool:
        code = split_comment(self.text)[0].rstrip()
        return code.endswith("&") and not code.endswith("&&")


@dataclass(frozen=True)
class Block:
    """One shell block of one file."""

    path: str  # relative to the project, e.g. "docs/deployment.md"
    line: int  # 1-based line of the opening fence
    language: str
    body: str
    illustration: str | None  # the marker's reason; "" for a marker without one

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def runnable(self) -> bool:
        return self.illustration is None

    def commands(self) -> list[Command]:
        return list(_commands(self))


def split_comment(text: str) -> tuple[str, str]:
    """``(code, comment)``: the comment starts at the first ``#`` outside quotes that begins a
    word, as bash reads it; the comment is returned without the ``#``."""
    quote: str | None = None
    escaped = False
    for i, ch in enumerate(text):
        if escaped:
            escaped = False
        elif ch == "\\" and quote != "'":
            escaped = True
        elif quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or text[i - 1].isspace()):
            return text[:i], text[i + 1 :].strip()
    return text, ""


def shell_blocks(root: Path, relative: str) -> list[Block]:
    """Every shell block of ``root/relative``, in file order."""
    lines = (root / relative).read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        fence = opening["fence"]
        start = i
        i += 1
        body: list[str] = []
        indent = len(opening["indent"])  # a fence inside a list item: its body is indented too
        while i < len(lines) and not lines[i].strip().startswith(fence):
            line = lines[i]
            body.append(line[min(indent, len(line) - len(line.lstrip(" "))) :])
            i += 1
        i += 1  # the closing fence
        language = opening["info"].lower()
        if language not in SHELL_LANGUAGES:
            continue
        marker = _MARKER.match(lines[start - 1]) if start > 0 else None
        illustration = (marker["why"] or "") if marker else None
        blocks.append(Block(relative, start + 1, language, "\n".join(body), illustration))
    return blocks


def documented_files(root: Path) -> list[str]:
    """README.md and docs/*.md, relative to ``root``."""
    docs = sorted(p.relative_to(root).as_posix() for p in (root / "docs").glob("*.md"))
    return ["README.md", *docs]


def _logical_lines(block: Block) -> Iterator[tuple[int, str]]:
    """(file line, text) of each command line, ``\\`` continuations joined; for console
    blocks only the ``$ `` lines (and their continuations)."""
    pending: list[str] = []
    pending_line = 0
    console = block.language == "console"
    for offset, raw in enumerate(block.body.splitlines()):
        line_no = block.line + 1 + offset
        if pending:
            text = raw
        elif console:
            if not raw.startswith("$ "):
                continue  # output
            text = raw[2:]
        else:
            text = raw
        if not pending:
            pending_line = line_no
        if text.rstrip().endswith("\\") and not split_comment(text)[1]:
            pending.append(text.rstrip()[:-1])
            continue
        pending.append(text)
        joined = " ".join(part.strip() for part in pending)
        pending = []
        if joined.strip() and not joined.strip().startswith("#"):
            yield pending_line, joined.strip()
    if pending:
        yield pending_line, " ".join(part.strip() for part in pending)


def _commands(block: Block) -> Iterator[Command]:
    for line_no, text in _logical_lines(block):
        _, comment = split_comment(text)
        exit_match = _EXIT.match(comment)
        yield Command(
            line=line_no,
            text=text,
            expected_exit=int(exit_match["code"]) if exit_match else 0,
            until_stopped=bool(_UNTIL_STOPPED.match(comment)),
        )


def convention_errors(block: Block) -> list[str]:
    """What in a block breaks the convention (before anything runs)."""
    if block.illustration is not None:
        if not block.illustration.strip():
            return [f"{block.id}: an illustration marker must say why the block cannot run"]
        return []
    errors = []
    for command in block.commands():
        if command.backgrounded and not command.until_stopped:
            errors.append(
                f"{block.path}:{command.line}: `{command.text}` runs in the background: end it "
                "with `# runs until stopped` so the test starts, checks and stops it"
            )
        if command.until_stopped and command.expected_exit:
            errors.append(
                f"{block.path}:{command.line}: a command that runs until stopped has no exit code"
            )
    return errors


# --------------------------------------------------------------------------------------------
# illustration blocks: every `episodic` command they name exists, with its options
# --------------------------------------------------------------------------------------------

_OPTION = re.compile(r"(?<![\w-])--[A-Za-z0-9][A-Za-z0-9-]*")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def _alternatives(code: str) -> list[str]:
    """``a [x | y] | b`` -> ``["a [x | y]", "b"]``: split at ``|`` outside brackets."""
    parts, depth, current = [], 0, []
    tokens = code.split(" ")
    for token in tokens:
        depth += token.count("[") + token.count("(") - token.count("]") - token.count(")")
        if token == "|" and depth == 0:
            parts.append(" ".join(current))
            current = []
        else:
            current.append(token)
    parts.append(" ".join(current))
    return [p.strip() for p in parts if p.strip()]


def _words(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:
        return text.split()


def synopsis_errors(block: Block, root_command: object) -> list[str]:
    """Every ``episodic`` command named in ``block`` exists and takes every ``--option`` shown.

    ``root_command`` is the click group of ``episodic`` (``typer.main.get_command(app)``).
    Synopsis notation is understood: ``[optional]``, ``a | b`` alternatives (an alternative
    that starts with a subcommand name starts a new command), ``gen|app|asm`` choices of a
    subcommand, ``--flag/--no-flag`` pairs and indented continuation lines.
    """
    import click

    assert isinstance(root_command, click.Group)
    errors: list[str] = []
    current: list[click.Command] = []
    previous_was_episodic = False
    lines = block.body.splitlines()
    for offset, raw in enumerate(lines):
        line_no = block.line + 1 + offset
        text = raw[2:] if block.language == "console" and raw.startswith("$ ") else raw
        if block.language == "console" and not raw.startswith("$ "):
            continue
        code = split_comment(text)[0].replace("\\", " ")
        continuation = raw[:1].isspace() and previous_was_episodic
        if not code.strip():
            continue
        episodic_line = continuation
        for n, alternative in enumerate(_alternatives(code)):
            words = _words(alternative.replace("[", " ").replace("]", " "))
            while words and _ASSIGNMENT.match(words[0]):
                words.pop(0)
            if not words:
                continue
            if words[0] == "episodic":
                episodic_line = True
                current = _resolve(root_command, words[1:], block, line_no, errors)
            elif n > 0 and episodic_line and words[0].split("|")[0] in root_command.commands:
                current = _resolve(root_command, words, block, line_no, errors)
            elif not (episodic_line and (n > 0 or continuation)):
                continue  # not an episodic command (make, prefect, export, ...)
            for command in current:
                _check_options(command, alternative, block, line_no, errors)
        previous_was_episodic = episodic_line
    return errors


def _resolve(
    group: object, words: list[str], block: Block, line_no: int, errors: list[str]
) -> list[object]:
    import click

    found: list[click.Command] = [group]  # type: ignore[list-item]
    path = ["episodic"]
    for word in words:
        if word.startswith("-") or not all(isinstance(c, click.Group) for c in found):
            break
        names = word.split("|")
        nxt: list[click.Command] = []
        for parent in found:
            assert isinstance(parent, click.Group)
            for name in names:
                child = parent.commands.get(name)
                if child is None:
                    errors.append(
                        f"{block.path}:{line_no}: `{' '.join(path)} {name}`: no such command "
                        f"(commands: {', '.join(sorted(parent.commands))})"
                    )
                    return []
                nxt.append(child)
        found = nxt
        path.append(word)
    return list(found)


def _check_options(
    command: object, text: str, block: Block, line_no: int, errors: list[str]
) -> None:
    import click

    assert isinstance(command, click.Command)
    known = {"--help"}
    for param in command.params:
        known.update(o for o in (*param.opts, *param.secondary_opts) if o.startswith("--"))
    for option in _OPTION.findall(text):
        if option not in known:
            errors.append(
                f"{block.path}:{line_no}: `{command.name}` has no option {option} "
                f"(options: {', '.join(sorted(known))})"
            )


def select(blocks: Iterable[Block], runnable: bool) -> list[Block]:
    return [b for b in blocks if b.runnable is runnable]
