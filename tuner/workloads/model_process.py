"""The model process: where a mixed search's holistic workload runs with a candidate dispatch
table, so that no stored (candidate) source is ever imported by the search's own process, which
runs as root in the daemon.

`ModelWorkload` is the Tunable the search holds (tuner.workloads.base); every call goes to one
child, `python -m tuner.workloads.model_server`, confined as the judge's child is
(kernelsearch.harness: an allow-listed environment, its own temp dir, no network, Landlock, the
sandbox user `$KERNELSEARCH_SANDBOX_USER` (default nobody) when we are root, resource limits, its
session and process tree killed at a timeout). `install_table` hands it the table and a copy of
the sources it names (the store itself may be root's 0700 dir); `dispatch.install` runs there,
with its digest, guard and judgement checks. Requests and replies are JSON lines (never pickle):
a reply is data, a Measurement validated by pydantic here.

A failure of the process (it died, gave no answer in time, could not be started confined) is
`ModelProcessFailed`, a WorkloadFailed with a reason code (`model_crashed`, `model_timeout`,
`model_refused`): the evaluator records it as the trial's reason and the next request starts a
fresh process with the same runtime and table.

One process per set of stored sources. A stored source is written by a proposer and hostile
until proven otherwise; once imported it stays loaded, and whatever it left behind (patches,
caches, torch or allocator state) would bias the next table measured in that process. So a
process never serves two tables whose sets of stored-source digests (`DispatchTable.sources()`)
differ: `ModelWorkload` keys its processes by that set and keeps two at most, the installed
table's and the one installed before it (in a search, the incumbent's and the candidate's).
Tables of shipped variants only share the empty set's process (shipped code is trusted). The
cost: a model build per candidate trial that carries stored sources."""
from __future__ import annotations

import dataclasses
import json
import os
import select
import signal
import subprocess
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from safety import pychild
from tuner.workloads import model_process_launch as launch
from tuner.workloads import energy, model_trust
from tuner.errors import BadInput, WorkloadBroken, WorkloadFailed, WorkloadHang

MAX_REPLY = 64 << 20  # bytes of one reply
#: the model process's resource limits, at least (torch's thread pools and Triton's compiler
#: subprocesses); an operator's $KERNELSEARCH_SANDBOX_* raise them. Its CPU time: its start's
#: wall-clock budget on every CPU, then each request's (model_process_launch.cpu_budget)
MODEL_TASKS = 512
#: the operator's settings the model itself reads, passed on beside runner.child_env's allow-list
#: (the library extensions a table's library entries run: kernelsearch.libraries; the energy
#: window the model's measurements read: tuner.workloads.energy.WINDOW_ENV)
MODEL_ENV = ("METALTUNE_FLASHMLA_EXT", "METALTUNE_ENERGY_WINDOW_S")


class ModelProcessFailed(WorkloadFailed):
    """The model process died, hung or could not start confined: `code` names which."""

    def __init__(self, code: str, detail: str):
        super().__init__(detail)
        self.code = code


@dataclasses.dataclass(frozen=True)
class Recipe:
    """What the model process builds: a workload name the factory builds without a host
    (an entry registered with `model_process=True`: `llama`, `hf:<config>`, ...), or
    `LlamaWorkload(**llama)`."""

    workload: str = "llama"
    llama: Optional[dict[str, Any]] = None
    #: the module whose import registers `workload` (tuner.workloads.factory.Entry.module)
    module: Optional[str] = None
    threads: Optional[int] = None  # torch's intra-op threads there (None: torch's default)
    timeout_s: float = 600.0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class ModelProcess:
    """One confined child running a workload; `call(op, ...)` is one request and its reply."""

    def __init__(self, recipe: Recipe, start_timeout_s: float = 900.0,
                 sandbox_user: Optional[str] = None):
        from kernelsearch.harness import confine, runner
        from kernelsearch.harness.limits import Limits

        self.recipe = recipe
        user, stdlib_closed = None, False
        if os.geteuid() == 0:  # never run a stored source as root unless the operator said so
            try:
                user = confine.sandbox_user(sandbox_user)
            except (KeyError, ValueError) as e:
                raise ModelProcessFailed("model_refused", f"model process: no unprivileged "
                                         f"account to run it as: {e}") from None
            closed = confine.unreadable_install(user, "cuda" if launch.gpu_host() else "cpu") \
                if user else None
            if closed:
                raise ModelProcessFailed(
                    "model_refused", f"model process: the sandbox user (uid {user[0]}, "
                    f"{confine.USER_ENV}) cannot read {closed}; install metaltune where others "
                    f"can read, or set {confine.USER_ENV}=none to run it as root (still "
                    "confined: Landlock, seccomp, its own network namespace)")
            stdlib_closed = bool(user and confine.unreadable_install(user, paths=launch.stdlib()))
        try:
            lim = Limits.resolve(recipe.timeout_s)
        except ValueError as e:
            raise ModelProcessFailed("model_refused", f"model process: {e}") from None
        cpus = len(os.sched_getaffinity(0)) or 1
        self.limits = dataclasses.replace(lim, tasks=max(lim.tasks, MODEL_TASKS),
                                          cpu_s=max(lim.cpu_s, int(start_timeout_s * cpus) + 60))
        launch.sweep()  # what a killed search left (its process, its temp dirs)
        self.user = user
        self.work = runner.sandbox_dir(*(user or (None, None)))
        self.store = self.work / "store"  # the sources of the tables it is given, copied
        self.store.mkdir(mode=0o700)
        # written through this fd only: the child owns `work` and could put a link in the
        # store's place, which a path would follow (we are root)
        self._store_fd = os.open(self.store, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        if user:
            os.fchown(self._store_fd, *user)
        self._copied: set[str] = set()
        self._private = tempfile.mkdtemp(prefix=launch.PRIVATE_PREFIX)  # its stderr, ours only
        self._err = os.path.join(self._private, "stderr")
        env = runner.child_env(os.environ, self.work)
        env.update({k: os.environ[k] for k in MODEL_ENV if k in os.environ})
        r, w = os.pipe()
        with open(self._err, "w") as err:
            # as root until its drop: its cwd and module path are ours; it dies with us
            self.proc = launch.popen(pychild.argv("tuner.workloads.model_server", str(w)), env,
                                     self._private, err, w, runner.new_session)
        os.close(w)
        launch.record(self._private, self.work, self.proc.pid)
        self._r, self._buf, self._seq, self._budgeted = r, bytearray(), 0, False
        self.tree = runner.ProcessTree(self.proc.pid)
        self._finalizer = weakref.finalize(self, launch.shutdown, self.proc, self.tree,
                                           (r, self._store_fd), str(self.work), self._private)
        self.info = self._send({"recipe": recipe.to_dict(), "work": str(self.work),
                                "user": list(user) if user else None,
                                "limits": self.limits.to_dict(),
                                "stdlib_closed": stdlib_closed, "parent": os.getpid()},
                               start_timeout_s)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None and self._finalizer.alive

    def spent(self) -> bool:
        """Its CPU limit (no per-request one: no CAP_SYS_RESOURCE) is 80% used: start afresh."""
        return not self._budgeted and launch.cpu_used(self.pid) > 0.8 * self.limits.cpu_s

    def call(self, op: str, wait_s: float, on_mark: Optional[Any] = None, **args: Any) -> Any:
        """The reply to request `op` (its arguments `args`), waited for `wait_s` at most;
        `on_mark`: the model_trust.SampleClock its sample marks go to (none: a mark kills it)."""
        return self._send({"op": op, **args}, wait_s, on_mark)

    def copy_sources(self, shas: Sequence[str], store_dir: Optional[Path]) -> None:
        """Put the stored sources a table names into its own store (digest checked on the way;
        quarantine and judgements travel in the record): what it installs from."""
        from kernelsearch.store import SourceStore, StoreError

        todo = [s for s in shas if s not in self._copied]
        if not todo or store_dir is None:
            return
        src = SourceStore(store_dir)
        for sha in todo:
            try:
                text, rec = src.source(sha), src.record(sha)
            except StoreError:
                continue  # not there: its install there refuses it, by name
            for name, data in ((f"{sha}.py", text.encode()),
                               (f"{sha}.json", json.dumps(rec.to_dict(), default=str).encode())):
                try:  # O_EXCL: never through a name it made first
                    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                                 0o600, dir_fd=self._store_fd)
                except FileExistsError:
                    continue  # its own doing: the digest check there refuses a changed file
                with os.fdopen(fd, "wb") as f:
                    if self.user:
                        os.fchown(f.fileno(), *self.user)
                    f.write(data)
            self._copied.add(sha)

    # -- the pipe --------------------------------------------------------------------------
    def _send(self, req: dict[str, Any], timeout_s: float, on_mark: Optional[Any] = None) -> Any:
        if not self.alive():
            raise self._died("the model process is not running")
        self._seq += 1
        self._budgeted = launch.cpu_budget(self.proc.pid, timeout_s) or self._budgeted
        req = {**req, "id": self._seq}  # echoed: a stray line never passes for the reply
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write((json.dumps(req, default=str) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self._died("it closed its requests pipe") from None
        reply = self._recv(timeout_s, req.get("op", "start"), on_mark)
        if not isinstance(reply, dict) or "ok" not in reply or reply.get("id") != self._seq:
            self._kill()
            raise ModelProcessFailed("model_crashed", "model process: a reply that is not the "
                                     f"reply to {req.get('op', 'start')!r}")
        if reply["ok"]:
            return reply.get("value")
        err, msg = str(reply.get("error")), str(reply.get("message", ""))[:2000]
        if "op" not in req:  # the start failed: it ends
            self._kill()
            if err == "BadInput":
                raise BadInput(msg.partition(": ")[2] or msg)
            raise ModelProcessFailed("model_crashed", f"model process did not start: {msg}")
        if err in ("WorkloadFailed", "WorkloadHang", "ValueError"):
            raise {"WorkloadFailed": WorkloadFailed, "WorkloadHang": WorkloadHang,
                   "ValueError": ValueError}[err](msg.partition(": ")[2] or msg)
        if err == "WorkloadBroken":  # its device context is gone: so is the process
            self._kill()
            raise WorkloadBroken(msg.partition(": ")[2] or msg)
        self._kill()  # an error of its own making: start afresh rather than trust its state
        raise ModelProcessFailed("model_crashed", f"model process: {req.get('op')}: {msg}")

    def _recv(self, timeout_s: float, op: str, on_mark: Optional[Any] = None) -> Any:
        got = time.monotonic()  # when the last chunk was read: a mark's time of arrival
        deadline = got + timeout_s
        while True:
            nl = self._buf.find(b"\n")
            if nl >= 0:
                line = bytes(self._buf[:nl])
                del self._buf[:nl + 1]
                try:
                    msg = json.loads(line)
                except (ValueError, RecursionError):
                    self._kill()
                    raise ModelProcessFailed("model_crashed",
                                             "model process: an unreadable reply") from None
                if not (isinstance(msg, dict) and "mark" in msg and msg.get("id") == self._seq):
                    return msg
                if on_mark is None:
                    self._kill()
                    raise ModelProcessFailed("model_crashed", f"model process: a mark in {op!r}")
                on_mark.mark(msg, got)
                self._go(on_mark)
                continue
            if len(self._buf) > MAX_REPLY:
                self._kill()
                raise ModelProcessFailed("model_crashed", f"model process: a reply over "
                                         f"{MAX_REPLY >> 20} MiB")
            left = deadline - time.monotonic()
            if left <= 0:
                self._kill()
                raise ModelProcessFailed("model_timeout", f"model process: no answer to "
                                         f"{op!r} within {timeout_s:g} s; its process tree "
                                         "was killed")
            ready, _, _ = select.select([self._r], [], [], min(left, 0.2))
            if ready:
                chunk = os.read(self._r, 1 << 16)
                got = time.monotonic()
                if chunk:
                    self._buf += chunk
                    continue
                raise self._died(f"it ended during {op!r}")
            if self.proc.poll() is not None:
                raise self._died(f"it ended during {op!r}")
            _, tasks = self.tree.scan()
            if tasks >= self.limits.tasks:
                self._kill()
                raise ModelProcessFailed("model_crashed", f"model process: {tasks} processes/"
                                         f"threads below it, at the limit of {self.limits.tasks}"
                                         "; killed")

    def _go(self, clock: Any) -> None:
        """Let it run its next sample: the sample's window opens now, before it can start."""
        clock.went(time.monotonic())
        try:  # (stdin: a pipe, as Popen was asked)
            self.proc.stdin.write(b'{"go": %d}\n' % self._seq)  # type: ignore[union-attr]
            self.proc.stdin.flush()  # type: ignore[union-attr]
        except (BrokenPipeError, OSError):
            raise self._died("it closed its requests pipe") from None

    def _died(self, why: str) -> ModelProcessFailed:
        try:
            rc = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            rc = None
        tail = ""
        try:  # before close() removes it
            tail = Path(self._err).read_text(errors="replace").strip()[-600:]
        except OSError:
            pass
        self._kill()
        how = (f"signal {signal.Signals(-rc).name}" if rc is not None and rc < 0
               else f"exit code {rc}")
        return ModelProcessFailed("model_crashed", f"model process crashed ({why}, {how})"
                                  + (f": {tail}" if tail else ""))

    def _kill(self) -> None:
        """After a failure: its whole tree killed at once (no `stop` asked of it), then closed."""
        if self._finalizer.alive:
            self.tree.kill()
        self._finalizer()

    def close(self) -> None:
        """Asked to stop (10 s), then killed; its temp dirs removed."""
        self._finalizer()


@dataclasses.dataclass
class _Served:
    """One model process of a ModelWorkload and what it was given."""

    mp: ModelProcess
    installed: bool  # the table last named for its set is installed there
    runtime: Optional[dict[str, Any]] = None  # what was configured there


class ModelWorkload:
    """Tunable (tuner.workloads.base) whose model runs in `ModelProcess`es, one per set of stored
    sources (the module doc); every call goes to the installed table's. The first is started
    now (what it reports: device, runtime settings, first-step benchmark), a set's again after
    a failure, with the runtime configured and the table installed as before."""

    def __init__(self, recipe: Recipe, start_timeout_s: float = 900.0,
                 call_timeout_s: float = 600.0, sandbox_user: Optional[str] = None,
                 grace_s: Optional[float] = None):
        self.recipe, self.start_timeout_s = recipe, start_timeout_s
        #: how long past a measurement's own timeout it may take to answer (it stops at the
        #: timeout itself, but a size in flight, a capture or a compile, ends first); None:
        #: as long as the timeout again, 300 s at least
        self.grace_s = grace_s
        self.call_timeout_s, self.sandbox_user = call_timeout_s, sandbox_user
        self._procs: dict[frozenset[str], _Served] = {}
        self._set: frozenset[str] = frozenset()  # the installed table's sources: its process
        self._before: Optional[frozenset[str]] = None  # the set installed before it (kept alive)
        self._runtime: Optional[dict[str, Any]] = None  # what was configured, for a restart
        self._settings: Optional[dict[str, Any]] = None  # the runtime in force there
        self._table: Optional[dict[str, Any]] = None
        self._shas: list[str] = []
        self._store: Optional[Path] = None
        self.last_install: Optional[dict[str, Any]] = None  # its stats after the last install
        self._quarantined: set[str] = set()  # by quarantine_caught
        info = self.process().info
        self.name: str = info["name"]
        self.device: str = info["device"]
        self._info = info
        self.first_step_s: Optional[Callable[[], float]] = \
            self._first_step if info["first_step"] else None

    # -- the processes -----------------------------------------------------------------------
    def process(self) -> ModelProcess:
        """The installed table's set's running process, configured with the runtime; a fresh
        one (runtime and table re-sent) if it has none or it is gone."""
        s = self._procs.get(self._set)
        if s is not None and s.mp.alive() and s.mp.spent():
            s.mp.close()  # between requests, rather than its CPU limit during one
        if s is None or not s.mp.alive():
            if s is not None:
                del self._procs[self._set]
                s.mp.close()  # what a failure left: its temp dirs
            s = _Served(ModelProcess(self.recipe, self.start_timeout_s, self.sandbox_user),
                        installed=self._table is None)
            self._procs[self._set] = s
        if self._runtime is not None and s.runtime != self._runtime:
            got = s.mp.call("configure", self.call_timeout_s, runtime=self._runtime)
            s.runtime = dict(self._runtime)
            self._settings = got if isinstance(got, dict) else self._settings
        return s.mp

    @property
    def pid(self) -> Optional[int]:
        """The installed table's process (None: it has none running)."""
        s = self._procs.get(self._set)
        return s.mp.pid if s is not None and s.mp.alive() else None

    def pids(self) -> dict[frozenset[str], int]:
        """Every running model process, by the set of stored sources it serves."""
        return {k: s.mp.pid for k, s in self._procs.items() if s.mp.alive()}

    def _ready(self) -> ModelProcess:
        mp = self.process()
        s = self._procs[self._set]
        if not s.installed:
            mp.copy_sources(self._shas, self._store)
            self.last_install = mp.call("install", self.call_timeout_s, table=self._table,
                                        store=str(mp.store))
            s.installed = True
        return mp

    def install_table(self, table: Any, store_dir: Optional[Path] = None) -> None:
        """Install `table` where the model runs (sent with the next request that runs it), in
        the process of its set of stored sources; any process whose set is neither this one's
        nor the one installed before it is closed."""
        self._table = table.to_dict() if table is not None else None
        self._shas = list(table.sources()) if table is not None else []
        self._store = Path(store_dir) if store_dir is not None else None
        new = frozenset(self._shas)
        if new != self._set:
            self._before, self._set = self._set, new
            for k in [k for k in self._procs if k not in (new, self._before)]:
                self._procs.pop(k).mp.close()
        if self._set in self._procs:
            self._procs[self._set].installed = False

    def stats(self) -> dict[str, Any]:
        """pid, uid, confinement, dispatch stats and the stored sources' modules there."""
        return self._ready().call("stats", self.call_timeout_s)

    # -- Tunable -------------------------------------------------------------------------------
    def configure(self, runtime: Optional[Mapping[str, Any]]) -> None:
        """Now in the installed table's process; in another when it next serves."""
        self._runtime = dict(runtime or {})
        s = self._procs.get(self._set)
        if s is not None and s.mp.alive():
            try:
                got = s.mp.call("configure", self.call_timeout_s, runtime=self._runtime)
                s.runtime = dict(self._runtime)
                self._settings = got if isinstance(got, dict) else self._settings
            except ModelProcessFailed:  # the next request starts a fresh one, configured so;
                self._procs.pop(self._set).mp.close()  # it says why

    def measure(self, repeats: int = 5, timeout_s: Optional[float] = None) -> Any:
        from tuner.trial import Measurement

        t = timeout_s or self.call_timeout_s
        wait = t + (self.grace_s if self.grace_s is not None else max(300.0, t))
        mp, timing = self._ready(), self._info.get("timing")
        if timing:  # set up first: the parent's clock of `measure` then times runs only
            mp.call("prepare", wait)
        clock = model_trust.SampleClock()  # each sample timed here
        with energy.ParentWindow(self) as window:  # the parent's own reading, around the request
            t0 = time.monotonic()
            d = mp.call("measure", wait, on_mark=clock, repeats=repeats, timeout_s=timeout_s)
            wall = time.monotonic() - t0
        try:
            m = Measurement.model_validate(d)
            if timing:
                m = model_trust.judge(m, clock, wall, timing, self.device)
            energy.replace_with_parents(m, window.reading)  # never the process's own watts
        except model_trust.Untrusted as e:
            raise ModelProcessFailed(model_trust.CODE, f"model process: untrusted measurement: {e}") from None
        except ValueError as e:
            raise ModelProcessFailed("model_crashed", f"model process: not a measurement "
                                     f"({str(e).splitlines()[0][:200]})") from None
        mp = m.extra.get("model_process")
        self.quarantine_caught(mp.get("incidents") if isinstance(mp, dict) else None)
        return m

    def quarantine_caught(self, incidents: Any) -> list[str]:
        """Quarantine in the real store the stored sources the kernel canary caught computing
        wrong in the model process (canary_reader.quarantine_caught). Returns the digests."""
        from kernelsearch.canary_reader import quarantine_caught

        if self._store is None:
            return []
        return quarantine_caught(self._store, self._shas, self._quarantined, incidents)

    def _first_step(self) -> float:
        try:
            return float(self._ready().call("first_step", self.call_timeout_s))
        except (ModelProcessFailed, TypeError, ValueError):
            return float("inf")  # as a failed first step is; its measure says why

    def check(self) -> Optional[dict[str, Any]]:
        return self._ready().call("check", self.call_timeout_s)

    def runtime_dims(self) -> dict[str, list[Any]]:
        return {k: list(v) for k, v in self._info["runtime_dims"].items()}

    def runtime_settings(self) -> dict[str, Any]:
        return dict(self._settings if self._settings is not None
                    else self._info["runtime_settings"])

    def validate_runtime(self, runtime: Mapping[str, Any]) -> Any:
        try:
            return self.process().call("validate", self.call_timeout_s, runtime=dict(runtime))
        except ModelProcessFailed as e:
            raise ValueError(f"runtime not checked: {e}") from None

    #: Tunable: the tables it is given are installed in its model processes, stored sources too
    runs_stored_sources = True

    def kernels_usable(self) -> Optional[str]:
        return self._info["kernels_usable"]

    def kernel_calls(self) -> dict[Any, int]:
        return {(f, d, tuple(s)): n for f, d, s, n in self.process().call("calls",
                                                                          self.call_timeout_s)}

    def kernel_variants(self) -> Optional[Mapping[str, Sequence[str]]]:
        return self._info["kernel_variants"]

    def dispatch_changed(self) -> None:
        pass  # the process drops its runners itself when a table is installed there

    def close(self) -> None:
        for s in self._procs.values():
            s.mp.close()
        self._procs.clear()
        energy.close_parent_meter(self)
