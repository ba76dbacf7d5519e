"""The one way text from a provider (an error, a problem document's ``title`` and
``detail``, a validation list) is shown to a person: in an item's message, `runs show`, a
run's last line. It came from outside, so it is

- bounded: at most `WORDS_LIMIT` characters (one ``…`` marks a cut);
- one printable line: terminal escape sequences are removed whole, control and format
  characters (bidi overrides, NUL, line breaks) replaced by a space, and runs of white
  space collapsed;
- never a secret: every credential the caller knows (the profile's token) is replaced by
  ``[redacted]`` wherever it appears, and so is anything shaped like one (an
  ``Authorization`` scheme and its value, a Replicate ``r8_`` token), before the text is cut,
  so no cut can leave part of a token behind.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable

WORDS_LIMIT = 300
REDACTED = "[redacted]"
_CREDENTIAL_SHAPES = re.compile(
    r"(?i)\b(?:bearer|key|token|basic)\s+[^\s,;\"']{8,}|\br8_[A-Za-z0-9]{8,}"
)
_SPACES = re.compile(r"\s+")
# terminal escape sequences (CSI such as colours and screen clears, OSC such as titles and
# links): removed whole, not only their ESC, so no half of one is shown
_ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x9b[0-?]*[ -/]*[@-~]"
)


def provider_words(value: object, *, secrets: Iterable[str] = (), limit: int = WORDS_LIMIT) -> str:
    """`value` (a string, or a JSON value as a provider's reply holds it) as a message may
    show it; "" when it says nothing."""
    text = _ESCAPES.sub(" ", _as_text(value))
    text = "".join(" " if unicodedata.category(char)[0] in "CZ" else char for char in text)
    text = _SPACES.sub(" ", text).strip()
    for secret in secrets:
        if len(secret) >= 4:
            text = text.replace(secret, REDACTED)
    text = _CREDENTIAL_SHAPES.sub(REDACTED, text)
    if len(text) > limit:
        text = text[: limit - 1].rstrip() + "…"
    return text


def problem_words(body: object, *, secrets: Iterable[str] = ()) -> str:
    """What a refusal's JSON body says, as `provider_words`: an RFC 7807 problem document's
    ``title`` and ``detail`` (Replicate's 401/402/422), fal's ``detail`` (a string, or a list
    of validation errors with ``loc`` and ``msg``), or an ``error`` field; "" for anything
    else (the body is never echoed whole)."""
    if not isinstance(body, dict):
        return ""
    title, detail = body.get("title"), body.get("detail")
    if detail is None:
        detail = body.get("error") or body.get("message")
    parts = [_as_text(part) for part in (title, detail) if part not in (None, "", [], {})]
    if len(parts) == 2 and _says_the_same(parts[0], parts[1]):
        parts = [max(parts, key=len)]
    return provider_words(": ".join(parts), secrets=secrets)


def _says_the_same(title: str, detail: str) -> bool:
    """A title the detail starts by saying (Replicate's 429: "Request was throttled", then
    "Request was throttled. Expected available in 1 second."), or the other way round; a
    title the detail only mentions ("Not found", "... could not be found.") stays."""
    a, b = (part.strip().rstrip(".").lower() for part in (title, detail))
    return b.startswith(a) or a.startswith(b)


def refused_text(code: int, words: str = "") -> str:
    """A refused create's message: its status and the provider's words (the phrase ``create
    refused: HTTP {code}`` is what a run's last line reads its next step from,
    `episodic.pipeline.outcomes`)."""
    return f"create refused: HTTP {code}" + (f" ({words})" if words else "")


def result_refused_text(code: int, words: str = "") -> str:
    """A job whose result the provider refused (fal's 422 on a result: the model's validation
    of the input, after its queue took the request): its status and the provider's words.
    ``result refused: HTTP {code}`` is read as `refused_text`'s phrase is: the same input is
    refused again, so the next step is to fix it."""
    return f"result refused: HTTP {code}" + (f" ({words})" if words else "")


def _as_text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # a validation list: "body.prompt: field required; ..."
        return "; ".join(_validation(entry) for entry in value[:5])
    try:
        return json.dumps(value, ensure_ascii=False, sort_keys=True)[: WORDS_LIMIT * 4]
    except (TypeError, ValueError):
        return ""


def _validation(entry: object) -> str:
    if isinstance(entry, dict) and isinstance(entry.get("msg"), str):
        loc = entry.get("loc")
        where = ".".join(str(part) for part in loc) if isinstance(loc, list) else ""
        return f"{where}: {entry['msg']}" if where else entry["msg"]
    return _as_text(entry) if not isinstance(entry, list) else ""
