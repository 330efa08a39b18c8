"""Searches run by the daemon: `SearchChild`, a child process (`python -m tuner.daemon.child OP
ARGS`) in its own session, its output in a file under the state dir (never a pipe nobody
drains), its result the last JSON line; `SearchRunner`, the one search the daemon may have at a
time (asked for on the socket or due by the schedule), which holds the host's writer lock while
it runs. Plus the persisted time of the last scheduled start (survives restarts)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Optional

from safety import pychild
from tuner.daemon import logs, schedule
from tuner.ops.settings import NO_DAEMON_ENV
from tuner.errors import MetaltuneError, OperationFailed

#: searches never run inside the daemon: a child process gets the writer lock for the run
SEARCH_OPS = frozenset({"search_host", "search_kernel", "search_mixed"})


class SearchChild:
    def __init__(self, op: str, args: dict[str, Any], why: str, state_dir: Path):
        self.op, self.args, self.why = op, args, why
        self.out_path = Path(state_dir) / "search-child.out"
        self.started = time.time()
        env = dict(os.environ)
        env[NO_DAEMON_ENV] = "1"  # the child never calls back into the daemon
        env = pychild.env(env)  # it runs as root: no directory of another user's on its path
        self.tmp = env.get("TMPDIR")  # where its model processes make their temp dirs
        cmd = pychild.argv("tuner.daemon.child", op, json.dumps(args, default=str))
        with open(self.out_path, "w") as out:
            # own session: stopping it reaches the candidate processes it starts, too
            self.proc = subprocess.Popen(cmd, stdout=out, stdin=subprocess.DEVNULL, env=env,
                                         start_new_session=True)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def done(self) -> bool:
        return self.proc.poll() is not None

    def wait(self) -> int:
        return self.proc.wait()

    def stop(self, grace_s: float = 10.0) -> int:
        """SIGTERM (its open transaction rolls back as it unwinds), then SIGKILL after grace_s."""
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            return self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait()
        finally:
            self.sweep()

    def sweep(self) -> None:
        """The temp dirs of its model processes and their sandboxes, now that it is gone: a
        child the SIGTERM reached mid-start, or the SIGKILL, leaves them (issue 42 item 15), and
        nothing else would remove them before the next search."""
        try:
            from tuner.workloads.model_process_launch import sweep

            sweep(self.tmp)
        except Exception as e:  # noqa: BLE001 - a stop never fails on its clean-up
            import logging

            logging.getLogger(__name__).warning("search temp dirs not swept: %s", e)

    def result(self) -> Optional[dict[str, Any]]:
        """The operation's answer: the last JSON line the child printed."""
        try:
            with open(self.out_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                # the answer is one line (a kernel search's carries its trial log): 16 MiB
                f.seek(max(0, f.tell() - (16 << 20)))
                text = f.read().decode(errors="replace")
        except OSError:
            return None
        for line in reversed(text.strip().splitlines()):
            try:
                v = json.loads(line)
            except ValueError:
                continue
            if isinstance(v, dict):
                return v
        return None

    def info(self) -> dict[str, Any]:
        return {"op": self.op, "args": self.args, "why": self.why, "started": self.started,
                "pid": self.proc.pid}


class SearchRunner:
    """The daemon's search: started in a child that takes the host's writer lock over from the
    daemon for the run, finished by taking it back and recovering what the child left
    unconfirmed. `writer` serialises it with the daemon's other writes."""

    def __init__(self, writer: Any, config: Callable[[], Any], hand_over: Callable[[], None],
                 take_back: Callable[[float], None], recover: Callable[[], Any],
                 idle: Any, metrics: Callable[[], Any], changed: Callable[[], None]):
        self.writer, self.config = writer, config
        self.hand_over, self.take_back, self.recover = hand_over, take_back, recover
        self.idle, self.metrics, self.changed = idle, metrics, changed
        self.child: Optional[SearchChild] = None
        self.info: dict[str, Any] = {}

    @property
    def running(self) -> bool:
        return self.child is not None

    @property
    def pid(self) -> Optional[int]:
        return self.child.pid if self.child is not None else None

    def request(self, op: str, args: dict[str, Any], wait_s: float) -> dict[str, Any]:
        """A search asked for through the socket (its arguments already checked by its
        options model): run it now in a child and answer its result."""
        child = self.start(op, args, why="operator request", wait_s=wait_s)
        child.wait()
        return self.finish(child)

    def tick(self) -> None:
        """Stop a search past its time; start the scheduled one when it is due."""
        cfg = self.config()
        if self.child is not None:
            if time.time() - self.child.started > cfg.search.timeout_s:
                self.stop("search.timeout_s reached")
            return
        due, _ = schedule.search_due(cfg.search, self.idle, last_started(cfg.state_dir))
        if not due:
            return
        sc = cfg.search
        args: dict[str, Any] = {"budget": sc.budget, "proposer": sc.proposer}
        if sc.family:
            args["family"] = sc.family
        if cfg.policy:
            args["policy"] = str(cfg.policy)
        try:
            self.start(f"search_{sc.kind}", args, why="schedule", wait_s=0.0)
        except MetaltuneError as e:
            logs.log("search.skipped", level="warning", reason=str(e))

    def start(self, op: str, args: dict[str, Any], why: str, wait_s: float) -> SearchChild:
        if not self.writer.acquire(timeout=wait_s):
            raise OperationFailed("busy: another write is in progress; try again")
        try:
            if self.child is not None:
                raise OperationFailed(f"a search is already running (pid {self.child.pid})")
            state_dir = self.config().state_dir
            self.hand_over()  # the host's writer lock to the child: never two writers
            try:
                child = SearchChild(op, args, why, state_dir)
            except OSError as e:
                self.take_back(60.0)
                raise OperationFailed(f"cannot start the search: {e}") from None
            self.child, self.info = child, child.info()
            record_started(state_dir, child.started)
            self._gauge(1)
            logs.log("search.started", pid=child.pid, op=op, why=why, args=brief(args))
            self.changed()
            return child
        finally:
            self.writer.release()

    def reap(self) -> None:
        c = self.child
        if c is None or not c.done() or c.why == "operator request":
            return  # a requested search is finished by the thread that waits for it
        self.finish(c)

    def finish(self, child: SearchChild) -> dict[str, Any]:
        with self.writer:
            if self.child is not child:
                return self.info.get("result", {})
            code = child.wait()
            self.child = None
            self._gauge(0)
            res = child.result()
            # take the writer lock back (a watchdog finishing the child's rollback may hold it
            # briefly), then undo anything the child left unconfirmed
            self.take_back(60.0)
            rec = self.recover()
            n = len((rec or {}).get("recovered", []) or [])
            self.info.update(result=res, exit_code=code, finished=time.time())
            logs.log("search.finished", level="info" if code == 0 else "warning",
                     pid=child.pid, exit_code=code, recovered=n, **logs.summary(res or {}))
            self.changed()
            if code != 0 and res is not None and res.get("ok") is False:
                e = OperationFailed(res.get("error", "search failed"))
                e.exit_code = int(res.get("exit_code", 1))
                raise e
            return res or {"exit_code": code}

    def stop(self, why: str) -> bool:
        c = self.child
        if c is None:
            return False
        logs.log("search.stop", pid=c.pid, reason=why)
        c.stop()
        self.reap()
        return True

    def _gauge(self, v: int) -> None:
        m = self.metrics()
        if m is not None:
            m.search.set(v)


def brief(args: dict[str, Any]) -> dict[str, Any]:
    return {k: (v if len(json.dumps(v, default=str)) < 200 else "...") for k, v in args.items()}


def last_started(state_dir: Path) -> Optional[float]:
    return _load(state_dir).get("last_search_started")


def record_started(state_dir: Path, when: float) -> None:
    st = {**_load(state_dir), "last_search_started": when}
    path = Path(state_dir) / "daemon-state.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(st))
    os.replace(tmp, path)


def _load(state_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((Path(state_dir) / "daemon-state.json").read_text())
    except (OSError, ValueError):
        return {}
