"""Runs a candidate in a child process with a timeout and a memory limit: a crash, a hang or an
out-of-memory kill becomes a verdict, never an exception in the caller."""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional, Union

from kernelsearch.harness.judge import guard_stage
from kernelsearch.harness.verdict import Verdict


def _rss_bytes(pid: int) -> int:
    """Resident memory of a process and its children (Linux /proc)."""
    total = 0
    try:
        pids = [pid] + [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        pids = [pid]
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def _limits():  # runs in the child before exec
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.setsid()


def check(family: str, candidate: Union[str, Path], config: Optional[dict] = None, *,
          device: str = "cpu", isolate: bool = True, timeout_s: float = 300.0,
          mem_limit_mb: int = 6144, gpu_mem_limit_mb: Optional[int] = 32768, ceilings=None,
          **judge_kw) -> Verdict:
    """Judge a candidate (source text or a path to a .py file). Host memory is limited by
    watching the child's resident set; device memory by the child's allocator cap."""
    t0 = time.time()
    is_path = isinstance(candidate, Path) or ("\n" not in candidate and candidate.endswith(".py"))
    p = Path(candidate) if is_path else None
    source = p.read_text() if p is not None else str(candidate)
    v = guard_stage(source) if judge_kw.get("static_guard", True) else None
    if v:  # static: never executes candidate code, so it runs here
        v.seconds = time.time() - t0
        return v
    if not isolate:
        from kernelsearch.harness.judge import judge

        return judge(family, source, config, device=device, ceilings=ceilings, **judge_kw)
    with tempfile.TemporaryDirectory(prefix="ks-judge-") as d:
        req = dict(judge_kw, family=family, source=source, config=config, device=device,
                   gpu_mem_limit_mb=gpu_mem_limit_mb,
                   ceilings=dataclasses.asdict(ceilings) if ceilings else None)
        req_path, out_path = os.path.join(d, "req.json"), os.path.join(d, "out.json")
        with open(req_path, "w") as f:
            json.dump(req, f)
        env = dict(os.environ)
        if device == "cpu":
            env["TRITON_INTERPRET"] = "1"
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        err_path = os.path.join(d, "stderr")
        with open(err_path, "w") as err:
            proc = subprocess.Popen([sys.executable, "-m", "kernelsearch.harness.child",
                                     req_path, out_path], stdout=subprocess.DEVNULL, stderr=err,
                                    env=env, cwd=d, preexec_fn=_limits)
        deadline = t0 + timeout_s
        peak = 0
        killed = None
        while proc.poll() is None:
            peak = max(peak, _rss_bytes(proc.pid))
            if peak > mem_limit_mb * 2 ** 20:
                killed = "memory_limit"
            elif time.time() > deadline:
                killed = "timeout"
            if killed:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
                break
            time.sleep(0.05)
        seconds = time.time() - t0
        tail = Path(err_path).read_text(errors="replace")[-1500:] if os.path.exists(err_path) else ""
        if killed == "timeout":
            return Verdict.reject("process", "timeout", "wall_clock",
                                  f"no verdict within {timeout_s:g} s; process group killed",
                                  seconds=seconds)
        if killed == "memory_limit":
            return Verdict.reject("process", "crashed", "memory_limit",
                                  f"resident memory {peak / 2**20:.0f} MiB over the "
                                  f"{mem_limit_mb} MiB limit; killed", seconds=seconds)
        if os.path.exists(out_path):
            with open(out_path) as f:
                v = Verdict.from_dict(json.load(f))
            v.seconds = seconds
            return v
        rc = proc.returncode
        rule = f"signal:{signal.Signals(-rc).name}" if rc < 0 else f"exit:{rc}"
        return Verdict.reject("process", "crashed", rule,
                              f"child ended ({rule}) without a verdict. stderr: {tail.strip()[-800:]}",
                              seconds=seconds)
