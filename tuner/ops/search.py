"""Search operations: "search_host", "search_kernel", "search_mixed" (the daemon runs each in a
child process)."""
from __future__ import annotations

from typing import Any

from tuner.ops.registry import operation


@operation("search_host")
def search_host(settings: Any, **kw: Any) -> dict[str, Any]:
    from tuner.search.host.run import run_host_search

    return run_host_search(settings, **kw)


@operation("search_kernel")
def search_kernel(settings: Any, **kw: Any) -> dict[str, Any]:
    """Kernel search (tuner/search/kernel.py); kw as run_kernel_search (family, budget, ...).
    proposer "llm": the loop for kernel sources (tuner/search/sources.py, kw as
    run_source_search)."""
    from pathlib import Path

    if kw.get("proposer") == "llm":
        from tuner.search.sources import run_source_search

        kw = {k: v for k, v in kw.items() if k not in ("proposer", "seed", "isolate")}
        return run_source_search(Path(settings.state_dir), **kw)
    from tuner.search.kernel import run_kernel_search

    return run_kernel_search(Path(settings.state_dir), **kw)


@operation("search_mixed")
def search_mixed(settings: Any, **kw: Any) -> dict[str, Any]:
    """Host, runtime and kernel candidates in one search (tuner/search/mixed/run.py)."""
    from tuner.search.mixed.run import run_mixed_search

    return run_mixed_search(settings, **kw)
