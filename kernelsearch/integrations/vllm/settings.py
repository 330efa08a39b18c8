"""The plugin's settings, read from the engine's environment (vLLM loads general plugins in every
engine process with no arguments, so the environment is the one channel a user has):

- METALTUNE_VLLM_TABLE: unset or empty: the plugin does nothing. A path: that dispatch table
  (JSON, what `metaltune search kernel` writes or host_profiles/kernels/ ships). `shipped`: the
  table shipped for this process's GPU (none for a CPU or an unknown GPU: the plugin stays off
  and says so).
- METALTUNE_VLLM_STORE: where `src:` entries' kernel sources are (default: kernelsearch's).
- METALTUNE_VLLM_COUNT: a file the plugin appends its load, call counts and canary incidents to
  (kernelsearch.integrations.vllm.counter); its folder must exist.

A bad value is one `PluginError` line naming the variable, the value and what was expected."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

TABLE_ENV = "METALTUNE_VLLM_TABLE"
STORE_ENV = "METALTUNE_VLLM_STORE"
COUNT_ENV = "METALTUNE_VLLM_COUNT"
SHIPPED = "shipped"


class PluginError(ValueError):
    """A setting the plugin cannot use (the message is one line)."""


@dataclass(frozen=True)
class Settings:
    table: Optional[Path]  # None: the plugin is off
    store: Optional[Path]
    count: Optional[Path]
    why_off: str = ""  # why `table` is None, for the log


def _table(raw: str) -> tuple[Optional[Path], str]:
    from kernelsearch.shipped import device_name, shipped_table

    if not raw:
        return None, f"{TABLE_ENV} is not set"
    if raw == SHIPPED:
        gpu = device_name()
        path = shipped_table(gpu) if gpu else None
        if path is None:
            return None, (f"{TABLE_ENV}=shipped: no table is shipped for "
                          f"{gpu or 'a process without a GPU'}")
        return path, ""
    p = Path(raw)
    if not p.is_file():
        raise PluginError(f"{TABLE_ENV}={raw}: no such file (expected a dispatch table JSON, "
                          f"or '{SHIPPED}')")
    return p, ""


def read(env: Optional[Mapping[str, str]] = None) -> Settings:
    """The settings in `env` (default os.environ); the table file is checked to exist here and
    parsed by the caller (DispatchTable.load's own error names the field)."""
    env = os.environ if env is None else env
    table, why = _table(env.get(TABLE_ENV, "").strip())
    store = env.get(STORE_ENV, "").strip()
    if store and not Path(store).is_dir():
        raise PluginError(f"{STORE_ENV}={store}: not a folder (expected a kernel source store)")
    count = env.get(COUNT_ENV, "").strip()
    if count and not Path(count).parent.is_dir():
        raise PluginError(f"{COUNT_ENV}={count}: its folder does not exist")
    return Settings(table, Path(store) if store else None, Path(count) if count else None, why)
