"""Resource limits of the process that runs candidate code (the child's worker, see `child.py`),
set after it is confined and inherited by everything it starts.

- tasks (RLIMIT_NPROC): processes *and threads*, a fork or thread bomb fails with EAGAIN. The
  kernel counts them per real uid, so the rlimit is set to the uid's other tasks plus this
  budget; it is not enforced for root (sandbox user `none` as root), and `runner.py` also counts
  the tasks of the child's tree while it runs and kills the tree at the budget, for every uid.
  Default: 128 + 2 per CPU: a CPU judge uses 4 (2 cores); torch's intra-op and inter-op pools
  grow to one thread per core each, the CUDA driver starts a few per context, Triton runs gcc
  (its launcher stub) and ptxas as subprocesses.
- open files (RLIMIT_NOFILE): default 1024, the usual login default torch, CUDA and Triton run
  under everywhere.
- file size (RLIMIT_FSIZE): no file it writes (Triton's cache, ptxas output, in its temp dir)
  grows past it; default 512 MiB. Python ignores SIGXFSZ, so the write fails with EFBIG.
- CPU time (RLIMIT_CPU, per process): a backstop for the wall-clock timeout, which the parent
  enforces: a spinning tree is stopped even if the parent is gone. Default 2 x the timeout +
  60 s: the worker is mostly one busy thread, so this never fires before the timeout would.
- address space: not limited. CUDA reserves virtual ranges the size of host plus device memory
  at start-up, so any RLIMIT_AS a GPU judge survives bounds nothing; host memory is limited by
  the parent watching the tree's resident set (`mem_limit_mb`), device memory by the allocator
  cap (`gpu_mem_limit_mb`).

Each is configurable by an environment variable of the caller (e.g. a daemon's unit file)."""
from __future__ import annotations

import errno
import os
import resource
from dataclasses import asdict, dataclass
from typing import Optional

ENV = {
    "tasks": "KERNELSEARCH_SANDBOX_TASKS",
    "nofile": "KERNELSEARCH_SANDBOX_NOFILE",
    "fsize_mb": "KERNELSEARCH_SANDBOX_FSIZE_MB",
    "cpu_s": "KERNELSEARCH_SANDBOX_CPU_S",
}
# gpu_mem_limit_mb's default: the device memory free when the child starts, less GPU_SLACK_MB
# (what other processes hold stays theirs; a fixed 32 GiB ran a 32 x 128k MLA check out of memory)
GPU_FREE = "free"
GPU_SLACK_MB = 2048
# the least a judge needs to start (the interpreter, torch and its threads, a compiler run)
MINIMUM = {"tasks": 16, "nofile": 64, "fsize_mb": 16, "cpu_s": 30}


@dataclass(frozen=True)
class Limits:
    tasks: int
    nofile: int
    fsize_mb: int
    cpu_s: int

    @classmethod
    def defaults(cls, timeout_s: float) -> "Limits":
        return cls(tasks=128 + 2 * (os.cpu_count() or 1), nofile=1024, fsize_mb=512,
                   cpu_s=int(2 * timeout_s) + 60)

    @classmethod
    def resolve(cls, timeout_s: float, environ: Optional[dict] = None) -> "Limits":
        """The defaults, each replaced by its environment variable if set. ValueError naming
        the variable for a value that is not a whole number at or above its minimum."""
        env = os.environ if environ is None else environ
        vals = asdict(cls.defaults(timeout_s))
        for key, var in ENV.items():
            text = env.get(var, "").strip()
            if not text:
                continue
            if not text.isdigit() or int(text) < MINIMUM[key]:
                raise ValueError(f"{var}={text!r}: expected a whole number >= {MINIMUM[key]}")
            vals[key] = int(text)
        return cls(**vals)

    def to_dict(self) -> dict:
        return asdict(self)


def tasks_of_uid(uid: int) -> int:
    """Processes and threads whose real uid is `uid`: what RLIMIT_NPROC counts."""
    import psutil

    n = 0
    for p in psutil.process_iter(["uids", "num_threads"]):
        u, t = p.info["uids"], p.info["num_threads"]
        if u is not None and u.real == uid and t:
            n += t
    return n


def apply(limits: Limits) -> dict:
    """Set the limits on this process (the worker, after any uid drop, alone in its tree).
    Returns what was set, for the verdict."""
    import psutil

    uid = os.getuid()
    nproc = tasks_of_uid(uid) - psutil.Process().num_threads() + limits.tasks
    _lower(resource.RLIMIT_NPROC, nproc)
    _lower(resource.RLIMIT_NOFILE, limits.nofile)
    _lower(resource.RLIMIT_FSIZE, limits.fsize_mb << 20)
    # the soft limit sends SIGXCPU (a named verdict); the hard one SIGKILL, should it be caught
    _lower(resource.RLIMIT_CPU, limits.cpu_s, limits.cpu_s + 5)
    return dict(limits.to_dict(), nproc_rlimit=nproc,
                nproc_enforced=uid != 0)  # root's tasks are only counted by the parent


def _lower(which: int, soft: int, hard: Optional[int] = None) -> None:
    """Lower (never raise) a limit: an operator's stricter ulimit stays."""
    cur_soft, cur_hard = resource.getrlimit(which)
    hard = soft if hard is None else hard
    if cur_hard != resource.RLIM_INFINITY:
        hard = min(hard, cur_hard)
    soft = min(soft, hard)
    if cur_soft != resource.RLIM_INFINITY:
        soft = min(soft, cur_soft)
    resource.setrlimit(which, (soft, hard))


def _env_hint(key: str) -> str:
    return f"raise it with {ENV[key]}" if key in ENV else ""


def classify(exc: BaseException) -> Optional[tuple[str, str]]:
    """(rule, detail) when a candidate's exception is a limit of this module refusing it."""
    if isinstance(exc, BlockingIOError) and exc.errno == errno.EAGAIN or (
            isinstance(exc, RuntimeError) and "can't start new thread" in str(exc)):
        soft = resource.getrlimit(resource.RLIMIT_NPROC)[0]
        return "process_limit", (f"the candidate hit the process/thread limit (RLIMIT_NPROC "
                                 f"{soft} for uid {os.getuid()}; {_env_hint('tasks')}): {exc}")
    if isinstance(exc, OSError) and exc.errno == errno.EMFILE:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return "open_files_limit", (f"the candidate hit the open-file limit ({soft}; "
                                    f"{_env_hint('nofile')}): {exc}")
    if isinstance(exc, OSError) and exc.errno == errno.EFBIG:
        soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        return "file_size_limit", (f"the candidate wrote a file past the size limit "
                                   f"({soft >> 20} MiB; {_env_hint('fsize_mb')}): {exc}")
    return None
