"""Search operations: "search_host", "search_kernel", "search_mixed" (the daemon runs each in a
child process). Each takes its options model (tuner.search.options), built from the arguments
wherever they arrive from (the socket, the daemon's search child) or built once by the CLI when
it runs the search in its own process (tuner.ops.registry: `.run`)."""
from __future__ import annotations

import contextlib
import signal
import threading
from pathlib import Path
from typing import Any, Iterator

from tuner.errors import BadInput
from tuner.ops.registry import operation
from tuner.search.options import HostSearchOptions, KernelSearchOptions, MixedSearchOptions


@contextlib.contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """A SIGTERM of the CLI running a search unwinds it like Ctrl-C: the open transaction rolls
    back and the model processes and sandboxes are stopped and their temp dirs removed (the
    default action killed the CLI on the spot and left them to the next search's sweep; issue
    42 item 15). The daemon's search child does the same (tuner.daemon.child); elsewhere than
    the main thread (a daemon's request thread), or under a handler of the caller's, a no-op."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@operation("search_host", options=HostSearchOptions)
def search_host(settings: Any, o: HostSearchOptions) -> dict[str, Any]:
    from tuner.search.host.run import run_host_search

    with sigterm_unwinds():
        return run_host_search(settings, o)


@operation("search_kernel", options=KernelSearchOptions)
def search_kernel(settings: Any, o: KernelSearchOptions) -> dict[str, Any]:
    """Kernel search (tuner/search/kernel.py); proposer "llm": the loop for kernel sources
    (tuner/search/sources.py)."""
    with sigterm_unwinds():
        return _search_kernel(settings, o)


def _search_kernel(settings: Any, o: KernelSearchOptions) -> dict[str, Any]:
    state = Path(settings.state_dir)
    shapes = [tuple(s) for s in o.shapes] if o.shapes else None
    table = Path(o.table_out) if o.table_out else None
    from tuner.search.objective import THROUGHPUT, of

    if o.proposer == "llm":
        from tuner.search.sources import run_source_search

        if of(o).describe() != THROUGHPUT.describe():  # said, not silently ignored
            raise BadInput(f"--objective {o.objective}: --proposer llm keeps kernel sources by "
                           "their time a call only; use --objective throughput")

        return run_source_search(
            state, o.family, budget=o.budget, device=o.device, shapes=shapes,
            incumbent_table=Path(o.incumbent_table) if o.incumbent_table else None,
            table_out=table, ideas=o.ideas, max_tokens=o.max_tokens, max_usd=o.max_usd,
            stop_after=o.stop_after, gpu=o.gpu, diagnosis=o.diagnosis, timeout_s=o.timeout_s,
            **({"models": tuple(o.models)} if o.models else {}),
            **({"model": o.model} if o.model else {}))
    from tuner.search.kernel import run_kernel_search

    trials: list[dict[str, Any]] = []
    res = run_kernel_search(state, o.family, budget=o.budget, proposer=o.proposer, seed=o.seed,
                            device=o.device, shapes=shapes, isolate=o.isolate, table_out=table,
                            timeout_s=o.timeout_s, on_trial=lambda t: trials.append(_brief(t)),
                            objective=of(o))
    return {**res, "trial_log": trials}


def _brief(t: Any) -> dict[str, Any]:
    """One trial of a kernel search as the CLI prints it (the store has the whole record)."""
    k = t.candidate.kernel
    return {"bucket": k.shape_bucket, "number": t.number, "variant": k.variant,
            "config": k.config, "verdict": str(t.verdict), "reason": t.reason,
            "time_us": 1e6 * t.measurements["time_s"] if t.measurements.get("time_s") else None}


@operation("search_mixed", options=MixedSearchOptions)
def search_mixed(settings: Any, o: MixedSearchOptions) -> dict[str, Any]:
    """Host, runtime and kernel candidates in one search (tuner/search/mixed/run.py)."""
    from tuner.search.mixed.run import run_mixed_search

    with sigterm_unwinds():
        return run_mixed_search(settings, o)
