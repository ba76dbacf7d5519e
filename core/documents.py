"""Reading the files people give us (playlists, provider profiles, legacy state.json): one
reader for all of them, so each refuses the same malformed input the same way.

Every problem is a `DocumentError` (a `ValueError`) with a one-line reason; callers wrap it
in their own error (naming the file). What is refused, whatever the format:

- a path that is not a regular file (a folder, a FIFO, a device), that does not exist or
  cannot be read (permissions, a name too long, a NUL byte), or that is larger than the limit;
- bytes that are not UTF-8 text;
- syntax errors (with the line and column), nesting deeper than `MAX_DEPTH` (a parser would
  otherwise die with RecursionError), and a key given twice in one mapping (YAML and JSON
  parsers silently keep the last one, so the file would not mean what it says);
- in JSON: NaN and Infinity (not JSON, and never a count or an amount).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, Strict

MAX_DEPTH = 64  # nesting of mappings and lists; our formats need fewer than 10
MAX_VALUES = 2_000_000  # values in one document, aliases followed (100,000 videos: ~1,000,000)
DEFAULT_MAX_BYTES = 5_000_000


def _whole_number(value: Any) -> Any:
    """A float with no fractional part (`seed: 1001.0`) as the int it equals: JSON and its
    Schema (draft 2020-12 "integer") make no difference between 1.0 and 1, so neither do the
    loaders; any other value is left for the strict int to refuse (`true`, "4", 1.5)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


WholeInt = Annotated[int, Strict(), BeforeValidator(_whole_number)]
"""An int field of a file people write: a strict int (never a bool or a string) that also
takes an integral float, as its JSON Schema ("type": "integer") does."""


class DocumentError(ValueError):
    """A file or text we cannot use as a document; the message is one line."""


def read_text(path: Path, *, max_bytes: int = DEFAULT_MAX_BYTES) -> str:
    """The UTF-8 text of a regular file of at most `max_bytes` (read at most once)."""
    try:
        # One open, checked through its descriptor (no check-then-read race); non-blocking,
        # so a FIFO at the path is refused instead of waiting forever for a writer.
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        with open(descriptor, "rb") as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise DocumentError("is not a regular file")
            if info.st_size > max_bytes:
                raise DocumentError(f"is larger than {_size(max_bytes)}")
            data = handle.read(max_bytes + 1)
    except FileNotFoundError:
        raise DocumentError("does not exist") from None
    except IsADirectoryError:
        raise DocumentError("is not a regular file") from None
    except OSError as exc:
        raise DocumentError(f"cannot be read ({exc.strerror or type(exc).__name__})") from None
    except ValueError as exc:  # "embedded null byte"
        if isinstance(exc, DocumentError):
            raise
        raise DocumentError("cannot be read (the path contains a NUL byte)") from None
    if len(data) > max_bytes:  # it grew while we read it
        raise DocumentError(f"is larger than {_size(max_bytes)}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DocumentError(f"is not UTF-8 text (byte {exc.start})") from None


def parse_yaml(text: str) -> Any:
    """One YAML document with safe types; duplicate keys and deep nesting refused."""
    import yaml

    try:
        document = yaml.load(text, Loader=_strict_loader())  # a SafeLoader subclass
    except DocumentError:
        raise
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        reason = exc.problem or exc.context or "syntax error"
        raise DocumentError(f"invalid YAML{where}: {reason}") from None
    except yaml.YAMLError as exc:
        raise DocumentError(f"invalid YAML: {_first_line(exc)}") from None
    except RecursionError:
        raise DocumentError(f"nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # an integer of 5000 digits (Python's conversion limit), ...
        raise DocumentError(f"invalid YAML: {_first_line(exc)}") from None
    _check_expanded(document)
    return document


def _check_expanded(value: Any) -> None:
    """Refuse a document that expands to more than MAX_VALUES values once its aliases are
    followed (a YAML alias is a shared reference: ten nested levels of nine aliases are a
    700-byte file of 3.5 billion values, which validation and error messages would walk).
    Iterative, and stops at the limit: the check itself costs at most MAX_VALUES steps."""
    stack = [value]
    seen = 0
    while stack:
        node = stack.pop()
        seen += 1
        if seen > MAX_VALUES:
            raise DocumentError(
                f"expands to more than {MAX_VALUES} values (YAML aliases repeat what they name)"
            )
        if isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def parse_json(text: str) -> Any:
    """One JSON document; duplicate keys, NaN/Infinity and deep nesting refused."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        mapping: dict[str, Any] = {}
        for key, value in items:
            if key in mapping:
                raise DocumentError(f"key {_key(key)} appears twice in one object")
            mapping[key] = value
        return mapping

    def constant(name: str) -> Any:
        raise DocumentError(f"{name} is not a JSON number")

    try:
        document = json.loads(text, object_pairs_hook=pairs, parse_constant=constant)
    except DocumentError:
        raise
    except json.JSONDecodeError as exc:
        raise DocumentError(
            f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
        ) from None
    except RecursionError:
        raise DocumentError(f"nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # an integer of 5000 digits, ...
        raise DocumentError(f"invalid JSON: {_first_line(exc)}") from None
    _check_depth(document)
    return document


def _check_depth(value: Any) -> None:
    """Refuse nesting past MAX_DEPTH (iteratively: the check itself never recurses)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if not isinstance(node, dict | list):
            continue
        if depth > MAX_DEPTH:
            raise DocumentError(f"nested deeper than {MAX_DEPTH} levels")
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, depth + 1) for child in children)


_LOADER: type | None = None


def _strict_loader() -> type:
    global _LOADER
    if _LOADER is not None:
        return _LOADER
    import yaml

    class StrictLoader(yaml.SafeLoader):
        depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            self.depth += 1
            try:
                if self.depth > MAX_DEPTH:
                    raise DocumentError(f"nested deeper than {MAX_DEPTH} levels")
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            if isinstance(node, yaml.MappingNode):
                seen: set[Any] = set()
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        continue
                    key = self.construct_object(key_node, deep=True)
                    try:
                        duplicate = key in seen
                    except TypeError:  # unhashable: the parent class says so
                        continue
                    if duplicate:
                        line = key_node.start_mark.line + 1
                        raise DocumentError(
                            f"key {_key(key)} appears twice in one mapping (line {line})"
                        )
                    seen.add(key)
            return super().construct_mapping(node, deep=deep)

    _LOADER = StrictLoader
    return StrictLoader


def _key(key: object) -> str:
    shown = repr(key)
    return shown if len(shown) <= 64 else f"{shown[:60]}…"


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _size(limit: int) -> str:
    return f"{limit / 1_000_000:g} MB" if limit >= 1_000_000 else f"{limit} bytes"
