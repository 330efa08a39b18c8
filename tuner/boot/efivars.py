"""systemd-boot's EFI variables (the Boot Loader Interface): a 4-byte attribute word, then a
NUL-terminated UTF-16LE string. Read here; written by `bootctl` (set-oneshot, set-default)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

VENDOR = "4a67b082-0a4c-41cf-b6c7-440b29bb8c4f"  # systemd-boot's vendor GUID
DIR = "/sys/firmware/efi/efivars"
ATTRS = (7).to_bytes(4, "little")  # non-volatile, boot service, runtime access


def path(host: Any, name: str) -> Path:
    return host.path(f"{DIR}/{name}-{VENDOR}")


def decode(data: bytes) -> Optional[str]:
    text = data[4:].decode("utf-16-le", errors="replace").split("\0", 1)[0]
    return text or None


def encode(text: str) -> bytes:
    return ATTRS + (text + "\0").encode("utf-16-le")


def read(host: Any, name: str) -> Optional[str]:
    try:
        return decode(path(host, name).read_bytes())
    except OSError:
        return None
