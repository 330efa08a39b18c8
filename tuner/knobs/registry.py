"""All knobs of a host, by name. Providers are tried in order; one that cannot reach its interface
(no NVML, no BMC configured) contributes nothing rather than failing the whole host."""
from __future__ import annotations

import fnmatch
import importlib
import logging
from typing import Any

from tuner.errors import BadInput, UnknownKnob
from tuner.knobs.base import Knob

log = logging.getLogger(__name__)

# module names under tuner.knobs; each defines discover(host) -> list[Knob]
PROVIDERS = ["gpu", "pcie", "cpu", "sysctl", "driver", "bios", "boot"]


def discover(host: Any, providers: list[str] | None = None,
             state_dir: Any = None) -> dict[str, Knob]:
    """`state_dir`: also the `kernels.table` knob (the host's active kernel dispatch table,
    tuner.knobs.kernels), which lives in metaltune's state dir rather than on a device."""
    knobs: dict[str, Knob] = {}
    if state_dir is not None:
        from tuner.knobs import kernels

        k = kernels.knob(host, state_dir)
        knobs[k.name] = k
    for mod_name in providers or PROVIDERS:
        mod = importlib.import_module(f"tuner.knobs.{mod_name}")  # a stale name fails loudly
        try:
            found = mod.discover(host)
        except BadInput:
            raise  # a broken config file (bmc.yaml) fails loudly, never drops its knobs silently
        except Exception as e:  # an interface that is not there is not an error for the host
            from tuner import redact

            log.debug("knob provider %s unavailable: %s", mod_name, redact.text(str(e)))
            continue
        for k in found:
            knobs[k.name] = k
    return knobs


def select(knobs: dict[str, Knob], names: list[str]) -> dict[str, Knob]:
    """Knobs matching names or glob patterns; an unknown name is bad input."""
    out: dict[str, Knob] = {}
    for pat in names:
        hits = [n for n in knobs if fnmatch.fnmatchcase(n, pat)]
        if not hits:
            raise UnknownKnob(f"unknown knob {pat!r}; this host has: {', '.join(sorted(knobs)) or 'none'}")
        for n in hits:
            out[n] = knobs[n]
    return out


def get(knobs: dict[str, Knob], name: str) -> Knob:
    try:
        return knobs[name]
    except KeyError:
        raise UnknownKnob(
            f"unknown knob {name!r}; this host has: {', '.join(sorted(knobs)) or 'none'}"
        ) from None
