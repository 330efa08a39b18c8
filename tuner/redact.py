"""Secrets out of text: credentials in URLs (`scheme://user:PW@host` -> `scheme://user:***@host`)
and every secret this process has loaded (`remember`), wherever text leaves the process (logs,
error lines, JSON answers)."""
from __future__ import annotations

import re
import threading
from typing import Any, Optional
from urllib.parse import unquote, urlsplit, urlunsplit

MASK = "***"
_URL_CREDS = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/@\s:]*):(?P<pw>[^@\s/]*)@")
_known: set[str] = set()
_mu = threading.Lock()


def remember(secret: Optional[str]) -> None:
    """A secret this process holds (a BMC password): masked in everything `text` sees."""
    if secret and len(secret) >= 4:  # shorter ones would mask ordinary words
        with _mu:
            _known.add(secret)


def text(s: str) -> str:
    s = _URL_CREDS.sub(lambda m: f"{m['head']}:{MASK}@", s)
    with _mu:
        known = sorted(_known, key=len, reverse=True)
    for k in known:
        if k in s:
            s = s.replace(k, MASK)
    return s


def value(v: Any) -> Any:
    """`text` applied to every string inside a JSON-like value."""
    if isinstance(v, str):
        return text(v)
    if isinstance(v, dict):
        return {k: value(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [value(x) for x in v]
    return v


def split_url(url: str) -> tuple[str, Optional[str], Optional[str]]:
    """(url without its userinfo, username, password) of `scheme://user:pw@host/...`."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None, None
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, sep, pw = userinfo.partition(":")
    clean = urlunsplit(parts._replace(netloc=hostport))
    return clean, unquote(user) or None, unquote(pw) if sep else None
