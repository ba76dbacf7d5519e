"""How a message names a URL: never with its user name and password (basic auth in
``https://user:PASSWORD@host/api`` would reach a terminal, a CI log, a chat paste)."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def without_userinfo(url: str) -> str:
    """`url` with any ``user:password@`` removed (and no query, where tokens go); a text
    that does not parse as a URL is shown as ``(a URL that does not parse)``."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "(a URL that does not parse)"
    if "@" not in parts.netloc and not parts.query:
        return url
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    netloc = f"{host}:{port}" if port is not None else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))
