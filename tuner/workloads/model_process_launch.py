"""Starting a model process (tuner.workloads.model_process) and tying its life to its parent's.

A model process runs in a session of its own (so a timeout can kill its whole tree), which a
signal to the CLI's or the search child's process group never reaches: a SIGKILL or SIGTERM of
the parent used to leave it running, at 100% of a core, and its temp dirs behind. So:

- it is started with `PR_SET_PDEATHSIG(SIGKILL)` (set between fork and exec): the kernel kills
  it when its parent dies. The kernel clears that setting when the process changes its uid,
  so the model server sets it again right after its privilege drop (`hold_to_parent`) and
  exits if its parent is already gone;
- its CPU time is limited to its start's wall-clock budget on every CPU it may use, then per
  request (`cpu_budget`, root with CAP_SYS_RESOURCE: prlimit on it) to what it has used plus
  the request's wait on every CPU, so a process that cleared its death signal (its candidate
  code can) burns one request's worth at most (without that capability, the start's budget,
  and the parent starts a fresh process before a request once 80% of it is used);
- its temp dirs are named in an `owner` file in its private dir (our pid and start time, its
  pid and start time, its work dir): `sweep()`, at every start, removes those of a parent that
  is gone (a SIGKILL runs no clean-up) and kills a model process of that parent still running.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

import psutil

from kernelsearch.harness.confine import die_with_parent

log = logging.getLogger(__name__)

PRIVATE_PREFIX = "metaltune-model-"
SANDBOX_PREFIX = "ks-sandbox-"  # kernelsearch.harness.runner.sandbox_dir's
OWNER = "owner"


def gpu_host() -> bool:
    return os.path.exists("/dev/nvidiactl")


def stdlib() -> list[str]:
    """This Python's standard-library folders (a pyenv under a 0700 /root: unreadable to the
    sandbox user, so the model process imports it ahead, see model_server.preload)."""
    import sysconfig

    base = sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_exec_prefix})
    return sorted({os.path.abspath(base[k]) for k in ("stdlib", "platstdlib") if k in base})


def preexec(parent: int, then: Any) -> Any:
    """A preexec_fn: `then()` (runner.new_session), then die with `parent`."""
    def fn() -> None:
        then()
        die_with_parent(parent)
    return fn


def hold_to_parent(parent: Optional[int]) -> None:
    """In the model server after its privilege drop (which cleared the death signal)."""
    if parent:
        die_with_parent(int(parent))


def _started(pid: int) -> Optional[float]:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def record(private: str, work: Path, child: int) -> None:
    """Write the owner file of a model process's temp dirs (ours: root's private dir, 0700)."""
    me = os.getpid()
    data = {"parent": me, "parent_start": _started(me), "child": child,
            "child_start": _started(child), "work": str(work)}
    fd = os.open(os.path.join(private, OWNER), os.O_WRONLY | os.O_CREAT | os.O_EXCL
                 | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)


def _alive(pid: Any, start: Any) -> bool:
    return isinstance(pid, int) and start is not None and _started(pid) == start


def _owner(private: Path) -> Optional[dict[str, Any]]:
    try:
        fd = os.open(private / OWNER, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None
        try:
            d = json.loads(f.read(4096))
        except ValueError:
            return None
    return d if isinstance(d, dict) else None


def _ours(st: os.stat_result) -> bool:
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()


def sweep(base: Optional[str] = None) -> list[str]:
    """Remove the temp dirs of model processes whose parent is gone (and kill such a process
    if it still runs). Only dirs we made (ours, not links) are read; a work dir is removed
    only where sandbox dirs are made. Returns the dirs removed."""
    base = base or tempfile.gettempdir()
    gone: list[str] = []
    try:
        entries = list(os.scandir(base))
    except OSError:
        return gone
    for e in entries:
        if not e.name.startswith(PRIVATE_PREFIX):
            continue
        private = Path(e.path)
        try:
            if not _ours(os.lstat(private)):
                continue
        except OSError:
            continue
        own = _owner(private)
        if own is None or _alive(own.get("parent"), own.get("parent_start")):
            continue
        if _alive(own.get("child"), own.get("child_start")):
            try:
                os.killpg(own["child"], signal.SIGKILL)  # its session: it leads it
            except OSError:
                pass
            try:
                psutil.Process(own["child"]).kill()
            except psutil.Error:
                pass
        work = Path(str(own.get("work", "")))
        if work.name.startswith(SANDBOX_PREFIX) and str(work.parent) in (base, "/tmp"):
            try:
                st = os.lstat(work)
            except OSError:
                st = None
            if st is not None and stat.S_ISDIR(st.st_mode):
                shutil.rmtree(work, ignore_errors=True)  # never follows a link in it
                gone.append(str(work))
        shutil.rmtree(private, ignore_errors=True)
        gone.append(str(private))
    if gone:
        log.info("removed %d temp dirs of model processes whose search is gone", len(gone))
    return gone


def cpu_used(pid: int) -> float:
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return t.user + t.system


def cpu_budget(pid: int, wait_s: float) -> bool:
    """As root with CAP_SYS_RESOURCE (raising a hard limit needs it): RLIMIT_CPU of process
    `pid` set to what it used so far plus `wait_s` on every CPU it may run on, plus a margin.
    False where it cannot be set: its limit from the start holds (ModelProcess.spent)."""
    if os.geteuid() != 0:
        return False
    try:
        p = psutil.Process(pid)
        cpus = len(p.cpu_affinity() or []) or (os.cpu_count() or 1)
        soft = int(cpu_used(pid) + wait_s * cpus) + 30
        p.rlimit(psutil.RLIMIT_CPU, (soft, soft + 5))
    except (psutil.Error, OSError, ValueError) as e:
        log.debug("model process %d: CPU limit not set: %s", pid, e)
        return False
    return True


def popen(argv: list[str], env: dict[str, str], cwd: str, err: Any, fd: int,
          then: Any) -> "subprocess.Popen[bytes]":
    """The model process: requests on stdin, replies on `fd`, stderr to `err`; `then` runs
    before exec (a session of its own), and the death signal is set after it."""
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=err,
                            env=env, cwd=cwd, pass_fds=(fd,),
                            preexec_fn=preexec(os.getpid(), then))


def shutdown(proc: "subprocess.Popen[bytes]", tree: Any, fds: tuple[int, ...], work: str,
             private: str) -> None:
    """ModelProcess's finalizer: asked to stop (10 s), then its whole tree killed; its temp
    dirs removed."""
    try:
        if proc.poll() is None and proc.stdin is not None:
            proc.stdin.write(b'{"op": "stop"}\n')
            proc.stdin.flush()
            proc.wait(timeout=10)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        pass
    if proc.poll() is None:
        tree.kill()
        proc.wait()
    tree.leftovers()
    for f in (proc.stdin,):
        try:
            if f is not None:
                f.close()
        except OSError:
            pass
    for fd in fds:
        os.close(fd)
    shutil.rmtree(work, ignore_errors=True)  # never follows a link it left there
    shutil.rmtree(private, ignore_errors=True)
