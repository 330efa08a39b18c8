"""The host's boot loader: systemd-boot when its entries and EFI variables are there, else GRUB."""
from __future__ import annotations

from typing import Any, Optional

from tuner.boot import efivars
from tuner.boot.bls import Bls
from tuner.boot.commands import Actions
from tuner.boot.grub import Grub
from tuner.errors import BadInput, OperationFailed

KINDS = {"grub": Grub, "systemd-boot": Bls}


def open_loader(host: Any, kind: Optional[str] = None, actions: Optional[Actions] = None) -> Any:
    if kind is None:
        if efivars.read(host, "LoaderInfo") or host.path("/boot/loader/entries").is_dir() and \
                not host.path("/boot/grub/grub.cfg").exists():
            kind = "systemd-boot"
        elif host.path("/boot/grub/grub.cfg").exists() or host.path("/boot/grub2/grub.cfg").exists():
            kind = "grub"
        else:
            raise OperationFailed("no supported boot loader found (GRUB 2 or systemd-boot)")
    if kind not in KINDS:
        raise BadInput(f"--loader: expected one of {', '.join(KINDS)}, got {kind!r}")
    return KINDS[kind](host, actions)
