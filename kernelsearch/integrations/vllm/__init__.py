"""metaltune's vLLM general plugin: the dispatch table's kernels inside the engine.

Installed with metaltune into the engine's environment (`pip install --no-deps metaltune`;
entry point `metaltune = "kernelsearch.integrations.vllm:register"` in the group
`vllm.general_plugins`), vLLM calls `register()` in every engine process. It does nothing unless
METALTUNE_VLLM_TABLE names a table (settings.py); then it installs that table with
`kernelsearch.dispatch.install` (the one loader: stored sources re-hashed, re-guarded and
re-judged as anywhere else), routes vLLM's RMSNorm (with its fused residual add) and SiluAndMul
through `torch.ops.metaltune.rmsnorm` / `swiglu` (layers.py), offers metaltune as a `vllm.ir`
provider, logs a kernel the canary removes through vLLM's logger, and, with METALTUNE_VLLM_COUNT,
records its load and call counts (counter.py). `VLLM_PLUGINS` (vLLM's own allow-list) without
`metaltune` keeps it from loading at all.

It also registers metaltune's MLA decode as vLLM's CUSTOM attention backend (mla.py; a user
picks it with `--attention-backend CUSTOM`). What a CUDA graph pins per captured batch size:
graphs.py. Which route each family takes on Hopper: docs/vllm-plugin.md."""
from __future__ import annotations

import logging
import os
import sys
from typing import Any, Optional

from kernelsearch.integrations.vllm.settings import TABLE_ENV, PluginError, Settings, read

log = logging.getLogger("vllm.metaltune")  # under vllm's logger: shown in the engine's log

_state: dict[str, Any] = {}  # what register did in this process ("settings", "replaced")


def register() -> None:
    """vLLM's entry point. A bad setting stops the engine process with one line and exit
    status 2 (no traceback); an unset table leaves vLLM as it is."""
    if "settings" in _state:
        return  # once per process (vLLM may call it again after a fork)
    try:
        s = read()
        _state["settings"] = s
        if s.table is None:
            log.debug("metaltune plugin off: %s", s.why_off)
            return
        enable(s)
    except PluginError as e:
        print(f"metaltune vLLM plugin: {e}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


def enable(s: Settings) -> list[str]:
    """Install the table and route the layers through metaltune's ops; returns what it
    replaced."""
    from kernelsearch import canary, dispatch
    from kernelsearch.integrations.vllm import counter
    from kernelsearch.table import TableError

    try:
        tbl = dispatch.install(s.table, store=s.store)
    except (TableError, OSError) as e:
        raise PluginError(f"{TABLE_ENV}: {e}".replace("\n", " ")) from None
    except ValueError as e:  # a bad KERNELSEARCH_CANARY_* (its message names it)
        raise PluginError(str(e).replace("\n", " ")) from None
    why = other_gpu(tbl)
    if why:
        dispatch.install(None)
        _state["off"] = why
        log.warning("metaltune plugin off: %s", why)
        return []
    from kernelsearch.integrations.vllm import layers  # imports vLLM: only once it is needed
    replaced = (layers.register_layers() + [f"vllm.ir.{n}" for n in layers.register_ir()]
                + layers.register_mla())
    _state["replaced"] = replaced
    canary.add_listener(_removed)
    if s.count is not None:
        counter.start(s.count)
        _record({"event": "loaded", "pid": os.getpid(), "table": str(s.table),
                 "entries": len(tbl.entries) if tbl is not None else 0, "replaced": replaced,
                 "refused": dispatch.refused()})
    log.info("metaltune: dispatch table %s (%d entries, device %r) installed; %s through "
             "torch.ops.metaltune%s", s.table, len(tbl.entries) if tbl else 0,
             getattr(tbl, "device", ""), ", ".join(replaced), _cpu_note())
    for sha, why in dispatch.refused().items():
        log.warning("metaltune: kernel source src:%s refused, its entries run the fallback: %s",
                    sha[:12], why)
    return replaced


# what a table's `device` says when it names no GPU model (built in code, by a search on "cuda",
# or under the CPU interpreter): nothing to compare (as kernelsearch.integrations.transformers)
GENERIC_DEVICES = ("", "cuda", "cpu", "cpu-interpreter")


def other_gpu(tbl: Any) -> Optional[str]:
    """Why a table must not run here: it was tuned and verified on another GPU model than this
    process's (a kernel's correctness and speed were judged there). None: it may."""
    from kernelsearch.shipped import device_name, gpu_slug

    dev = getattr(tbl, "device", "") or ""
    if dev in GENERIC_DEVICES:
        return None
    here = device_name()
    if here is not None and gpu_slug(here) == gpu_slug(dev):
        return None
    return (f"the table was tuned and verified on {dev}, this engine runs on "
            f"{here or 'no GPU'} (name a table measured here, or search one)")


def _cpu_note() -> str:
    import torch

    if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
        return ""
    return " (no GPU: every call runs the fallback, the family's torch op)"


def _record(rec: dict) -> None:
    from kernelsearch.integrations.vllm import counter

    s: Optional[Settings] = _state.get("settings")
    if s is None or s.count is None:
        return
    try:
        counter.append(s.count, rec)
    except OSError as e:
        log.warning("metaltune: %s not written: %s", s.count, e)


def _removed(incident: dict) -> None:
    """A kernel the canary caught computing wrong in the engine: said in the engine's log (and
    the count file); dispatch has already removed it and appended the incident to the canary
    log the daemon reads."""
    log.error("metaltune: kernel canary removed %s %s at %s: %s (%s entries removed; the calls "
              "run the fallback)", incident.get("family"), incident.get("variant"),
              incident.get("shape"), str(incident.get("detail", ""))[:200],
              incident.get("removed_entries"))
    _record({"event": "canary", "pid": os.getpid(), "incident": incident})
