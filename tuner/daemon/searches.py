"""A search run by the daemon: a child process (`python -m tuner.daemon.child OP ARGS`) in its own
session, its output in a file under the state dir (never a pipe nobody drains), its result the
last JSON line. Plus the persisted time of the last scheduled start (survives restarts)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

from tuner.daemon.client import NO_DAEMON_ENV


class SearchChild:
    def __init__(self, op: str, args: dict[str, Any], why: str, state_dir: Path):
        self.op, self.args, self.why = op, args, why
        self.out_path = Path(state_dir) / "search-child.out"
        self.started = time.time()
        env = dict(os.environ)
        env[NO_DAEMON_ENV] = "1"  # the child never calls back into the daemon
        cmd = [sys.executable, "-m", "tuner.daemon.child", op, json.dumps(args, default=str)]
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

    def result(self) -> Optional[dict[str, Any]]:
        """The operation's answer: the last JSON line the child printed."""
        try:
            with open(self.out_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 65536))
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
