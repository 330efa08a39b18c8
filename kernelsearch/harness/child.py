"""Child-process entry: `python -m kernelsearch.harness.child REQUEST.json RESULT.json`.

Two processes. This one, the warden, makes itself a child subreaper and forks the worker, which
confines itself (`confine.enter`: unprivileged uid when root, Landlock, its own temp dir) and
runs the judge; the verdict comes back over a pipe. Whatever the candidate starts (a fork, a
`setsid` daemon, a double fork) stays in the warden's process tree, because orphans are
re-parented to the nearest subreaper, and the warden kills all of it once the worker is done.
The warden never imports candidate code, torch or triton. A crash, a hang or an out-of-memory
kill is seen by the parent (`runner.check`) from the outside."""
from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import sys
import time
import traceback
from pathlib import Path

_PR_SET_CHILD_SUBREAPER = 36
MAX_VERDICT = 64 << 20  # bytes read back from the worker


def set_subreaper() -> None:
    if ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_CHILD_SUBREAPER failed")


def kill_descendants(deadline_s: float = 10.0) -> int:
    """SIGKILL every process below this one and reap it, until none is left (new forks made
    while we kill are caught on the next round). Returns how many were killed."""
    import psutil

    me = psutil.Process()
    killed = 0
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        kids = me.children(recursive=True)
        for k in kids:
            try:
                k.kill()
                killed += 1
            except psutil.Error:
                pass
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:  # reap what has ended (orphans are ours)
                pass
        except ChildProcessError:  # no child left, so no descendant either
            return killed
        time.sleep(0.01)
    return killed


def _worker(req: dict, w: int, warden: int) -> None:
    work = req.pop("work_dir", None)
    user = req.pop("sandbox_user", None)
    lim = req.pop("limits", None)
    report: dict = {}
    if work:
        from kernelsearch.harness import confine
        from kernelsearch.harness.limits import Limits

        report = confine.enter(Path(work), tuple(user) if user else None, req.get("family", ""),
                               req.get("device", "cpu"), Limits(**lim) if lim else None)
        confine.die_with_parent(warden)  # the drop cleared what the warden's fork kept
    from kernelsearch.harness.judge import judge
    from kernelsearch.harness.timing import Ceilings

    ceil = req.pop("ceilings", None)
    req["ceilings"] = Ceilings(**ceil) if ceil else None
    gpu_mb = req.pop("gpu_mem_limit_mb", None)
    if gpu_mb and req.get("device") == "cuda":
        import torch

        from kernelsearch.harness.limits import GPU_FREE, GPU_SLACK_MB

        total = torch.cuda.get_device_properties(0).total_memory
        cap = (torch.cuda.mem_get_info()[0] - GPU_SLACK_MB * 2 ** 20 if gpu_mb == GPU_FREE
               else gpu_mb * 2 ** 20)
        torch.cuda.set_per_process_memory_fraction(max(0.0, min(1.0, cap / total)))
        report = dict(report, gpu_mem_cap_mb=int(cap // 2 ** 20))
    source = req.pop("source")
    family = req.pop("family")
    config = req.pop("config", None)
    v = judge(family, source, config, **req)
    v.sandbox = report
    data = json.dumps(v.to_dict()).encode()
    view = memoryview(data)
    while view:
        view = view[os.write(w, view):]


def _collect(pid: int, r: int) -> tuple[bytes, int]:
    """Read the worker's verdict while it runs; return (bytes, wait status) once it has ended.
    EOF is not awaited: a descendant may hold the pipe's write end open."""
    buf = bytearray()
    status = None
    while status is None:
        ready, _, _ = select.select([r], [], [], 0.1)
        if ready:
            chunk = os.read(r, 1 << 16)
            if chunk and len(buf) < MAX_VERDICT:
                buf += chunk
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = st
    os.set_blocking(r, False)
    try:
        while len(buf) < MAX_VERDICT:
            chunk = os.read(r, 1 << 16)
            if not chunk:
                break
            buf += chunk
    except BlockingIOError:
        pass
    os.close(r)
    return bytes(buf), status


def main() -> int:
    req_path, out_path = sys.argv[1], sys.argv[2]
    with open(req_path) as f:
        req = json.load(f)
    set_subreaper()
    warden = os.getpid()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        code = 0
        try:
            _worker(req, w, warden)
            sys.stdout.flush()
        except BaseException:
            traceback.print_exc()
            sys.stderr.flush()
            code = 3
        os._exit(code)  # skip interpreter teardown: candidate objects may misbehave in finalisers
    os.close(w)
    data, status = _collect(pid, r)
    kill_descendants()
    if data:
        try:
            verdict = json.loads(data)
        except ValueError:
            verdict = None
        if isinstance(verdict, dict):
            tmp = out_path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(verdict, f)
            os.replace(tmp, out_path)
    if os.WIFSIGNALED(status):  # die the way the worker died, so the parent names the signal
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    return os.waitstatus_to_exitcode(status) if not os.WIFSIGNALED(status) else 1


if __name__ == "__main__":
    sys.exit(main())
