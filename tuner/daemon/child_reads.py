"""Read operations that load heavy frameworks (torch, triton: "kernel_check") run in a child of
the daemon, as searches do, so the resident daemon stays small; unlike a search, without the
writer lock (they change nothing) and concurrently. The arguments go on the child's stdin (a
candidate's text may be larger than one argv string may be)."""
from __future__ import annotations

import json
import subprocess
from typing import Any

from safety import pychild
from tuner.errors import OperationFailed
from tuner.ops.settings import NO_DAEMON_ENV

CHILD_READS = frozenset({"kernel_check"})
#: beyond the operation's own timeout (its judge child's): start-up and imports
SLACK_S = 120.0


def run(op: str, args: dict[str, Any]) -> dict[str, Any]:
    """The operation's result as the child answers it; its error with the child's exit code."""
    import os

    env = pychild.env({**os.environ, NO_DAEMON_ENV: "1"})  # never calls back into the daemon
    timeout = float(args.get("timeout_s", 300.0)) + SLACK_S
    try:
        p = subprocess.run(pychild.argv("tuner.daemon.child", op, "-"),
                           input=json.dumps(args, default=str), capture_output=True, text=True,
                           env=env, timeout=timeout, start_new_session=True)
    except subprocess.TimeoutExpired:
        raise OperationFailed(f"{op}: no answer from its child within {timeout:.0f}s") from None
    res = None
    for line in reversed(p.stdout.strip().splitlines()):
        try:
            res = json.loads(line)
            break
        except ValueError:
            continue
    if not isinstance(res, dict):
        raise OperationFailed(f"{op}: its child exited {p.returncode} without an answer")
    if p.returncode != 0 and res.get("ok") is False:
        e = OperationFailed(str(res.get("error", f"{op} failed")))
        e.exit_code = int(res.get("exit_code", 1))
        raise e
    return res
