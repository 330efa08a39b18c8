"""Runs a candidate in a child process with a timeout, a memory limit and resource limits
(`limits.py`): a crash, a hang, an out-of-memory kill or a fork bomb becomes a verdict, never an
exception in the caller.

The child (`child.py`) is a session and process-group leader and a child subreaper; its worker
runs the candidate confined (`confine.py`: unprivileged uid when root, Landlock, its own temp
dir, rlimits). On a timeout, the memory limit or the process/thread budget (counted here too:
root's tasks escape RLIMIT_NPROC) the whole tree below the child is killed before the child
itself (so nothing is re-parented away from it), then its process group; after every check any
process seen during the run, or still in the child's session, is killed too. Every temp dir the
check made is removed."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Optional, Union

import psutil

from kernelsearch.harness.judge import gluon_stage, guard_stage
from kernelsearch.harness.limits import ENV as LIMITS_ENV, GPU_FREE, Limits
from kernelsearch.harness.verdict import Verdict
from safety import pychild

# signals the kernel sends at a resource limit: (rule, the limit's key in Limits)
_LIMIT_SIGNALS = {signal.SIGXCPU: ("cpu_limit", "cpu_s"), signal.SIGXFSZ: ("file_size_limit",
                                                                          "fsize_mb")}


class _Tree:
    """The processes below the child, as seen while it ran (pid -> create time), and their
    sessions: what to kill if the child is gone and they are not."""

    def __init__(self, pid: int):
        self.root = pid
        self.seen: dict[int, float] = {}
        self.sids: set[int] = {pid}

    def scan(self) -> tuple[int, int]:
        """Record descendants; return the tree's resident memory in bytes and the number of
        tasks (processes and threads) below the child."""
        total = tasks = 0
        try:
            top = psutil.Process(self.root)
            procs = [top] + top.children(recursive=True)
        except psutil.Error:
            return 0, 0
        for p in procs:
            try:
                total += p.memory_info().rss
                if p.pid != self.root:
                    tasks += p.num_threads()
                    self.seen.setdefault(p.pid, p.create_time())
                    self.sids.add(os.getsid(p.pid))
            except (psutil.Error, OSError):
                pass
        return total, tasks

    def kill(self) -> None:
        """SIGKILL the child's tree (leaves first, while they are still below the subreaper),
        then its process group, then anything seen or left in one of its sessions."""
        for _ in range(50):
            try:
                kids = psutil.Process(self.root).children(recursive=True)
            except psutil.Error:
                break
            if not kids:
                break
            for k in kids:
                _kill(k)
        try:
            os.killpg(self.root, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.leftovers()

    def leftovers(self) -> None:
        for pid, created in self.seen.items():
            try:
                p = psutil.Process(pid)
                if p.create_time() == created:
                    _kill(p)
            except psutil.Error:
                pass
        for p in psutil.process_iter():
            try:
                if p.pid != self.root and os.getsid(p.pid) in self.sids - {os.getsid(0)}:
                    _kill(p)
            except (psutil.Error, OSError):
                pass


def _kill(p: "psutil.Process") -> None:
    try:
        p.kill()
    except psutil.Error:
        pass


# what the child may inherit from its caller: what Python, CUDA and Triton read, nothing else
# (a caller's METALTUNE_BMC_PASSWORD, tokens, proxies never reach candidate code)
ENV_NAMES = {"PATH", "HOME", "LANG", "LANGUAGE", "TZ", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES",
             "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "CC", "CXX",
             "OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYTORCH_CUDA_ALLOC_CONF",
             "PYTORCH_NVML_BASED_CUDA_CHECK", "TORCH_CUDA_ARCH_LIST"}
ENV_PREFIXES = ("LC_", "CUDA_", "TRITON_", "KERNELSEARCH_")
PASS_ENV = "KERNELSEARCH_SANDBOX_PASS_ENV"  # comma-separated extra names an operator passes on


def child_env(environ, work: Path) -> dict[str, str]:
    """The judge child's environment, built from an allow-list (never the caller's whole
    environment): ENV_NAMES, ENV_PREFIXES, the names $KERNELSEARCH_SANDBOX_PASS_ENV lists;
    TMPDIR in the sandbox's own dir (the worker points HOME and every cache there too before it
    loads a candidate; the interpreter starts with the caller's HOME, for its user site);
    PYTHONPATH with this package first."""
    extra = {n.strip() for n in environ.get(PASS_ENV, "").split(",") if n.strip()}
    env = {k: v for k, v in environ.items()
           if k in ENV_NAMES or k in extra or k.startswith(ENV_PREFIXES)}
    env.setdefault("PATH", os.defpath)
    env["TMPDIR"] = str(work / "tmp")
    root = str(Path(__file__).resolve().parents[2])
    pp = environ.get("PYTHONPATH")
    env["PYTHONPATH"] = root + (os.pathsep + pp if pp else "")
    return pychild.env(env)  # no entry another user could write: it starts as root


def _limits():  # runs in the child before exec
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.setsid()


def _dies_with(parent: int):
    """preexec_fn of the judge's child: `_limits`, and it dies with us (its own session is
    reached by no signal to ours: a killed CLI left it running)."""
    def fn() -> None:
        from kernelsearch.harness import confine

        _limits()
        confine.die_with_parent(parent)
    return fn


def _traversable(path: Path) -> bool:
    """Every directory from / to `path` lets others through (o+x): the sandbox user can reach
    its own dir below it."""
    p = path.resolve()
    for d in [p, *p.parents]:
        try:
            if not os.stat(d).st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
    return True


def _sandbox_dir(uid: Optional[int], gid: Optional[int]) -> Path:
    from kernelsearch.harness import confine

    base = Path(tempfile.gettempdir())
    if uid is not None and not _traversable(base):
        base = Path("/tmp")
    work = Path(tempfile.mkdtemp(prefix="ks-sandbox-", dir=base))
    confine.prepare_dir(work, uid, gid)
    return work


def check(family: str, candidate: Union[str, Path], config: Optional[dict] = None, *,
          device: str = "cpu", isolate: bool = True, timeout_s: float = 300.0,
          mem_limit_mb: int = 6144, gpu_mem_limit_mb: Union[int, str, None] = GPU_FREE,
          ceilings=None,
          sandbox_user: Optional[str] = None, limits: Optional[Limits] = None,
          **judge_kw) -> Verdict:
    """Judge a candidate (source text or a path to a .py file). Host memory is limited by
    watching the child tree's resident set; device memory by the child's allocator cap:
    gpu_mem_limit_mb MiB, or GPU_FREE (default) for what is free on the device when the child
    starts less GPU_SLACK_MB (what other processes hold stays theirs; a fixed cap either starves
    a large shape, 32 x 128k MLA needs over 32 GiB, or exceeds what is free), None for none.
    sandbox_user: the account candidate code runs as when we are root (default: $KERNELSEARCH_
    SANDBOX_USER, else nobody); a root caller without one gets a rejection, never a root run.
    limits: processes/threads, open files, file size, CPU time (default: `Limits.resolve`,
    the defaults and $KERNELSEARCH_SANDBOX_*)."""
    t0 = time.time()
    is_path = isinstance(candidate, Path) or ("\n" not in candidate and candidate.endswith(".py"))
    p = Path(candidate) if is_path else None
    source = p.read_text() if p is not None else str(candidate)
    # a library variant's wrapper is not Triton source: the judge checks it is the shipped one
    v = guard_stage(source) if judge_kw.get("static_guard", True) \
        and not judge_kw.get("library") else None
    if v is None and not judge_kw.get("library"):
        v = gluon_stage(source, device)
    if v:  # static: never executes candidate code, so it runs here
        v.seconds = time.time() - t0
        return v
    if not isolate:
        from kernelsearch.harness.judge import judge

        return judge(family, source, config, device=device, ceilings=ceilings, **judge_kw)
    if limits is None:
        try:
            limits = Limits.resolve(timeout_s)
        except ValueError as e:
            return Verdict.reject("process", "crashed", "sandbox_limits", str(e),
                                  seconds=time.time() - t0)
    user = None
    if os.geteuid() == 0:
        from kernelsearch.harness import confine

        try:
            user = confine.sandbox_user(sandbox_user)
        except (KeyError, ValueError) as e:
            return Verdict.reject("process", "crashed", "sandbox_user",
                                  f"no unprivileged account to run candidate code as: {e}",
                                  seconds=time.time() - t0)
        closed = confine.unreadable_install(user, device) if user else None
        if closed:  # fail closed, with the way out: never run candidate code as root silently
            return Verdict.reject(
                "process", "crashed", "sandbox_unreadable",
                f"the sandbox user (uid {user[0]}, {confine.USER_ENV}) cannot read {closed}, "
                "part of the Python install the judge runs (a venv or pyenv under a 0700 "
                f"home?): no "
                "candidate can be judged as that user. Install metaltune where others can read "
                f"(e.g. /opt), give that user read access, or set {confine.USER_ENV}=none to "
                "judge as root (Landlock, seccomp and the network namespace still hold)",
                seconds=time.time() - t0)
    work = _sandbox_dir(*(user or (None, None)))
    try:
        with tempfile.TemporaryDirectory(prefix="ks-judge-") as d:
            v = _run_child(d, work, user, family, source, config, device, timeout_s,
                           mem_limit_mb, gpu_mem_limit_mb, ceilings, limits, judge_kw, t0)
        if judge_kw.get("library"):  # a crash of the library's own code is still its verdict
            v.kind = "library"
            v.library = v.library or {"name": judge_kw["library"]}
        v.sandbox = dict(v.sandbox, timeout_s=timeout_s, mem_limit_mb=mem_limit_mb,
                         gpu_mem_limit_mb=gpu_mem_limit_mb)
        v.sandbox.setdefault("uid", user[0] if user else os.geteuid())  # the worker reports
        v.sandbox.setdefault("limits", limits.to_dict())  # what it became and what it set
        return v
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run_child(d, work, user, family, source, config, device, timeout_s, mem_limit_mb,
               gpu_mem_limit_mb, ceilings, limits, judge_kw, t0) -> Verdict:
    req = dict(judge_kw, family=family, source=source, config=config, device=device,
               gpu_mem_limit_mb=gpu_mem_limit_mb, work_dir=str(work), limits=limits.to_dict(),
               sandbox_user=list(user) if user else None,
               ceilings=dataclasses.asdict(ceilings) if ceilings else None)
    req_path, out_path = os.path.join(d, "req.json"), os.path.join(d, "out.json")
    with open(req_path, "w") as f:
        json.dump(req, f)
    env = child_env(os.environ, work)
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    err_path = os.path.join(d, "stderr")
    with open(err_path, "w") as err:
        proc = subprocess.Popen(pychild.argv("kernelsearch.harness.child", req_path, out_path),
                                stdout=subprocess.DEVNULL, stderr=err,
                                env=env, cwd=d, preexec_fn=_dies_with(os.getpid()))
    tree = _Tree(proc.pid)
    deadline = t0 + timeout_s
    peak = tasks = 0
    killed = None
    try:
        while proc.poll() is None:
            rss, tasks = tree.scan()
            peak = max(peak, rss)
            if peak > mem_limit_mb * 2 ** 20:
                killed = "memory_limit"
            elif tasks >= limits.tasks:
                killed = "process_limit"
            elif time.time() > deadline:
                killed = "timeout"
            if killed:
                tree.kill()
                proc.wait()
                break
            time.sleep(0.05)
    finally:
        if proc.poll() is None:  # interrupted (KeyboardInterrupt): leave nothing behind
            tree.kill()
            proc.wait()
        tree.leftovers()
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
    if killed == "process_limit":
        return Verdict.reject("process", "crashed", "process_limit",
                              f"{tasks} processes/threads below the child, at the limit of "
                              f"{limits.tasks} ({LIMITS_ENV['tasks']}); killed", seconds=seconds)
    if os.path.exists(out_path):
        with open(out_path) as f:
            v = Verdict.from_dict(json.load(f))
        v.seconds = seconds
        return v
    rc = proc.returncode
    if rc < 0 and -rc in _LIMIT_SIGNALS:
        rule, key = _LIMIT_SIGNALS[signal.Signals(-rc)]
        return Verdict.reject("process", "crashed", rule,
                              f"the candidate process was stopped by {signal.Signals(-rc).name}"
                              f" at the limit {key}={getattr(limits, key)} "
                              f"({LIMITS_ENV[key]})", seconds=seconds)
    rule = f"signal:{signal.Signals(-rc).name}" if rc < 0 else f"exit:{rc}"
    return Verdict.reject("process", "crashed", rule,
                          f"child ended ({rule}) without a verdict. stderr: {tail.strip()[-800:]}",
                          seconds=seconds)


# -- for other callers that run untrusted code in a confined child of their own (tuner's model
# process, tuner/workloads/model_process.py): the same pieces, not a second copy of them
ProcessTree = _Tree  # watch (scan) and kill a child's whole tree
sandbox_dir = _sandbox_dir  # a fresh temp dir the sandbox user owns, 0700
new_session = _limits  # preexec_fn: no core dumps, a session of its own
