"""Faults for the CLI tests of a failing run, put into the model process itself (where `search
mixed` runs its workload, tuner.workloads.model_process): a `sitecustomize.py` on the path the
model process inherits calls `inject(...)` at its start. What it injects is `fail_at`'s fault in
tests/workloads/test_run_failures.py: the dispatched call of a table kernel asks torch's
allocator for a workspace no machine has."""
from __future__ import annotations

import os
from pathlib import Path

HUGE = 1 << 50  # bytes: past any machine's memory and overcommit (1 PiB)

WHEN = {
    "always": lambda a: True,
    # an mla_decode call whose capacity (block table width x page size) is 32 tokens
    "mla_slot_32": lambda a: a[2].shape[1] * a[1].shape[1] == 32,
}


def inject(family: str, when: str, broken_probe: bool = False) -> None:
    from kernelsearch import dispatch

    real = dispatch.call

    def call(fam, *args):
        if fam == family and dispatch.resolve(fam, *args) is not None and WHEN[when](args):
            import torch

            torch.empty(HUGE, dtype=torch.uint8)  # RuntimeError: can't allocate memory
        return real(fam, *args)

    dispatch.call = call
    if broken_probe:  # the device probe after a failure fails too: a sticky CUDA error
        from tuner.workloads import holistic

        def probe(device):
            raise RuntimeError("CUDA error: an illegal memory access was encountered\nCUDA "
                               "kernel errors might be asynchronously reported")

        holistic.probe = probe


def wrong_sources() -> None:
    """Every stored source loaded from now on computes twice its output: what a source that
    behaved while judged does once installed (the kernel canary's case)."""
    from kernelsearch.harness import sandbox

    real = sandbox.load

    def load(source, tag=""):
        mod = real(source, tag)
        if tag == "src":
            fwd = mod.forward
            mod.forward = lambda *a, **k: fwd(*a, **k) * 2
        return mod

    sandbox.load = load


def in_model_process(monkeypatch, folder: Path, family: str = "", when: str = "",
                     broken_probe: bool = False, wrong: bool = False) -> None:
    """Every model process started from now on (this test's) gets the fault (`inject`, or
    `wrong_sources` when `wrong`): a sitecustomize on its PYTHONPATH, applied only in
    `tuner.workloads.model_server`; the sandbox user is `none` (still confined) so that it can
    read this test's folder."""
    import sys

    folder.mkdir(parents=True, exist_ok=True)
    call = "wrong_sources()" if wrong else f"inject({family!r}, {when!r}, {broken_probe!r})"
    (folder / "sitecustomize.py").write_text(
        "import sys\n"
        "if any(a.endswith('model_server') for a in sys.orig_argv):\n"
        "    from tests.workloads.faults import inject, wrong_sources\n"
        f"    {call}\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(folder)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    monkeypatch.setenv("KERNELSEARCH_SANDBOX_USER", "none")
    assert sys.version_info >= (3, 10)  # sys.orig_argv
