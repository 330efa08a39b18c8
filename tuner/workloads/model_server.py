"""The model process's own side: `python -m tuner.workloads.model_server REPLY_FD`, started by
`tuner.workloads.model_process.ModelProcess` (read that first).

It reads one JSON request a line on stdin and writes one JSON reply a line on REPLY_FD. The first
request builds the workload (project code only, as the launching user), then the process
confines itself exactly as the judge's worker does (`kernelsearch.harness.confine.enter`: its own
temp dir, no network, Landlock, the sandbox user when started as root, resource limits) and only
then answers requests; the first that names a dispatch table is where a stored source can first
be imported. Replies are plain JSON (never pickle): the parent is root and reads them as data.
"""
from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Optional

ERRORS = ("WorkloadFailed", "WorkloadHang", "WorkloadBroken", "BadInput", "ValueError")


def build(recipe: dict[str, Any]) -> Any:
    """The workload a recipe names: a registry entry's (`llama`, `hf:<config>`, ...: they take
    no host; `module` registers it), or `LlamaWorkload(**kwargs)` for `{"llama": kwargs}`."""
    threads = recipe.get("threads")
    if threads:
        import torch

        torch.set_num_threads(int(threads))
    if recipe.get("llama") is not None:
        from tuner.workloads.llama import LlamaWorkload

        return LlamaWorkload(**recipe["llama"])
    from tuner.workloads.factory import make_workload

    if recipe.get("module"):  # its registry line: the parent's, so code the parent imported
        import importlib

        importlib.import_module(str(recipe["module"]))
    return make_workload(None, recipe["workload"], None, float(recipe.get("timeout_s", 600.0)))


#: what later requests import, loaded while the install is still readable (a Python under a 0700
#: home is not, for the sandbox user; confine.preload covers the judge's own modules)
PRELOAD = ("zoneinfo", "hashlib", "secrets", "traceback", "linecache", "tokenize", "inspect",
           "ast", "tuner.trial", "tuner.workloads.base", "kernelsearch.dispatch",
           "kernelsearch.store", "kernelsearch.canary", "kernelsearch.table",
           "kernelsearch.harness", "kernelsearch.harness.guard", "kernelsearch.harness.sandbox",
           "kernelsearch.harness.runner", "kernelsearch.harness.child")


#: standard-library modules never imported ahead (side effects, or a display they need)
NOT_AHEAD = {"antigravity", "this", "tkinter", "turtle", "turtledemo", "idlelib", "ensurepip",
             "venv", "lib2to3", "pydoc_data", "__main__"}


def preload(stdlib: bool = False) -> None:
    """PRELOAD; with `stdlib` (the sandbox user cannot read this Python's standard library)
    every top-level standard-library module as well: torch, Triton and transformers import some
    lazily, long after the drop."""
    import importlib

    names = list(PRELOAD) + (sorted(set(sys.stdlib_module_names) - NOT_AHEAD) if stdlib else [])
    for m in names:
        try:
            importlib.import_module(m)
        except Exception:  # noqa: BLE001 - a module this platform lacks; the rest still load
            pass
    from kernelsearch import dispatch
    from kernelsearch.table import DispatchTable
    from tuner.trial import Measurement

    Measurement.model_validate(Measurement(metric="m", value=1.0).model_dump())
    dispatch.install(DispatchTable([]))  # its lazy imports (the canary's settings)
    dispatch.install(None)


def info(wl: Any) -> dict[str, Any]:
    """What the parent learns of the workload (tuner.workloads.base.Served: declared, not
    probed): the timing is said before any candidate code is loaded."""
    return {"name": wl.name, "device": wl.device, "runtime_dims": wl.runtime_dims(),
            "runtime_settings": wl.runtime_settings(), "kernels_usable": wl.kernels_usable(),
            "kernel_variants": {k: list(v) for k, v in (wl.kernel_variants() or {}).items()}
            if wl.kernel_variants() is not None else None,
            "first_step": wl.first_step_s is not None, "timing": wl.timing()}


def prepare(wl: Any) -> None:
    """Everything a measurement sets up first, so that the parent's clock of the `measure`
    request that follows times runs (Served.prepare)."""
    wl.prepare()


def stats(report: dict[str, Any]) -> dict[str, Any]:
    """Where the candidate code ran: this process, its uid and confinement, what dispatch loaded
    (the stored sources' modules), ran and refused."""
    from kernelsearch import dispatch

    return {"pid": os.getpid(), "uid": os.geteuid(), "sandbox": report,
            "dispatch": dispatch.stats(), "refused": {k[:16]: v[:300] for k, v in
                                                    dispatch.refused().items()},
            "sources": sorted(m for m in sys.modules if m.startswith("ks_src_")),
            # what the kernel canary caught here: its quarantine is in this process's copy of
            # the store only, so the parent records it in the real one
            "incidents": [{k: i.get(k) for k in ("kind", "family", "variant", "source_sha256",
                                                 "shape", "detail", "at")}
                          for i in dispatch.incidents()[-50:]]}


def handle(wl: Any, req: dict[str, Any], report: dict[str, Any]) -> Any:
    op = req.get("op")
    if op == "configure":
        wl.configure(req["runtime"])
        return wl.runtime_settings()
    if op == "validate":
        wl.validate_runtime(req["runtime"])
        return None
    if op == "install":  # loads the table's stored sources (their digest, guard and judgement)
        from kernelsearch import dispatch

        dispatch.install(req["table"], store=req.get("store"))
        wl.dispatch_changed()
        return stats(report)
    if op == "measure":
        m = wl.measure(repeats=int(req["repeats"]), timeout_s=req.get("timeout_s"))
        m.extra["model_process"] = stats(report)
        return m.model_dump()  # python mode: an inf stays a float (json writes Infinity)
    if op == "prepare":
        return prepare(wl)
    if op == "first_step":
        return wl.first_step_s()
    if op == "check":
        return wl.check()
    if op == "calls":
        return [[f, d, list(s), n] for (f, d, s), n in wl.kernel_calls().items()]
    if op == "stats":
        return stats(report)
    raise ValueError(f"model process: unknown request {op!r}")


def _reply(fd: int, obj: dict[str, Any]) -> None:
    data = (json.dumps(obj, default=str) + "\n").encode()
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def marker(fd: int, rid: Any) -> Any:
    """holistic.SAMPLE_MARK for request `rid`: the mark to the parent, then wait for its `go`,
    so the parent's clock from its `go` to the next mark brackets one sample and nothing else."""
    def mark(key: str, rate: Optional[float]) -> None:
        _reply(fd, {"mark": str(key), "rate": rate, "id": rid})
        line = sys.stdin.buffer.readline()
        if not line:  # the parent is gone
            os._exit(0)
        if json.loads(line).get("go") != rid:
            raise ValueError("model process: the answer to a sample mark is not its `go`")
    return mark


def _error(e: BaseException) -> dict[str, Any]:
    name = type(e).__name__
    if name not in ERRORS:  # a bug or the candidate's own exception: its last lines to stderr
        traceback.print_exc()
        sys.stderr.flush()
        name = "crash"
    return {"ok": False, "error": name, "message": f"{type(e).__name__}: {e}"[:2000]}


def main(argv: list[str]) -> int:
    from tuner.workloads.model_process_launch import hold_to_parent

    fd = int(argv[0])
    first = json.loads(sys.stdin.buffer.readline() or b"{}")
    try:
        wl = build(first["recipe"])
        closed = bool(first.get("stdlib_closed"))
        preload(stdlib=closed)
        calls = None
        if closed and wl.kernels_usable() is None:  # its whole call path once, while readable
            calls = wl.kernel_calls()
        from kernelsearch.harness import confine
        from kernelsearch.harness.limits import Limits

        user = first.get("user")
        report = confine.enter(Path(first["work"]), tuple(user) if user else None, "",
                               wl.device, Limits(**first["limits"]))
        hold_to_parent(first.get("parent"))  # the drop cleared the death signal
        _reply(fd, {"ok": True, "value": dict(info(wl), sandbox=report, pid=os.getpid()),
                    "id": first.get("id")})
    except BaseException as e:  # noqa: BLE001 - reported, then this process ends
        _reply(fd, dict(_error(e), id=first.get("id")))
        return 3
    for line in sys.stdin.buffer:
        req = json.loads(line)
        if req.get("op") == "stop":
            break
        try:
            if req.get("op") == "calls" and calls is not None:
                value: Any = [[f, d, list(s), n] for (f, d, s), n in calls.items()]
            elif req.get("op") == "measure":
                from tuner.workloads import holistic

                holistic.SAMPLE_MARK = marker(fd, req.get("id"))
                try:
                    value = handle(wl, req, report)
                finally:
                    holistic.SAMPLE_MARK = None
            else:
                value = handle(wl, req, report)
            _reply(fd, {"ok": True, "value": value, "id": req.get("id")})
        except Exception as e:  # noqa: BLE001 - every failure is the parent's to judge
            _reply(fd, dict(_error(e), id=req.get("id")))
    try:
        wl.close()
    finally:
        os._exit(0)  # skip teardown: candidate objects may misbehave in finalisers
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
