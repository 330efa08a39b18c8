"""Secrets out of text: credentials in URLs (`scheme://user:PW@host` -> `scheme://user:***@host`)
and every secret this process has loaded (`remember`), wherever text leaves the process (logs,
error lines, JSON answers).

Linear time on any input: the URL pattern starts only where a run of scheme characters starts
(a lookbehind), so a long word is tried once, not once per letter as the old pattern did (80,000
letters took it 15 s); its user and password parts cannot cross a `/`, so the tries never
overlap. And a text longer than MAX_TEXT is cut in the middle (at word boundaries, so no half
secret survives) before it is redacted."""
from __future__ import annotations

import re
import threading
from typing import Any, Optional
from urllib.parse import unquote, urlsplit, urlunsplit

MASK = "***"
MAX_TEXT = 16_384   # an error line or log line longer than this is cut before redaction
_URL_CREDS = re.compile(r"(?<![A-Za-z0-9+.-])(?P<head>[A-Za-z0-9+.-]+://[^/@\s:]*):[^@\s/]*@")
_known: set[str] = set()
_mu = threading.Lock()


def remember(secret: Optional[str]) -> None:
    """A secret this process holds (a BMC password): masked in everything `text` sees."""
    if secret and len(secret) >= 4:  # shorter ones would mask ordinary words
        with _mu:
            _known.add(secret)


def bound(s: str, limit: int = MAX_TEXT) -> str:
    """At most about `limit` characters: the middle is cut (the head says what failed, the tail
    often why), each cut dropping the word it falls in (it may be half a secret)."""
    if len(s) <= limit:
        return s
    half = limit // 2
    head, tail = s[:half], s[-half:]
    i = max(head.rfind(c) for c in " \n\t")
    head = head[:i] if i > 0 else ""
    j = [k for k in (tail.find(c) for c in " \n\t") if k >= 0]
    tail = tail[min(j):] if j else ""
    return f"{head} [... {len(s) - len(head) - len(tail)} characters cut]{tail}"


def text(s: str) -> str:
    s = _URL_CREDS.sub(lambda m: f"{m['head']}:{MASK}@", bound(s))
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
