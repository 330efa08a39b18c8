"""metaltune on a remote host: each fleet step is one `PYTHON -m tuner ...` command over SSH, with
the host's environment (`env K=V`) and working directory, its JSON output parsed here. This module
is the one place that knows the per-host command lines (status, verify, apply, confirm, rollback,
the compare child), so the rollout logic reads as policy only."""
from __future__ import annotations

import hashlib
import json
import shlex
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

from tuner.fleet import ssh
from tuner.fleet.inventory import Host

T = TypeVar("T")


@dataclass
class Outcome:
    """What one step did on one host: ok, or an error with a stable `kind`."""

    host: str
    ok: bool
    kind: str = "ok"            # ok | failed | unreachable | host_key_rejected | auth_failed | timeout | ...
    detail: str = ""
    data: Any = None
    rc: Optional[int] = None
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"host": self.host, "ok": self.ok, "kind": self.kind, "detail": self.detail,
                "rc": self.rc, "seconds": round(self.seconds, 2), "data": self.data}


class Remote:
    """One host's SSH session plus the metaltune commands run through it."""

    def __init__(self, host: Host, trust_new: bool = False, timeout: float = 600.0) -> None:
        self.host = host
        self.session = ssh.Session(host.ssh_target(trust_new))
        self.timeout = timeout

    def close(self) -> None:
        self.session.close()

    def _cmd(self, argv: list[str]) -> str:
        cmd = ssh.env_prefix(self.host.env) + shlex.join([self.host.python, *argv])
        if self.host.cwd:
            cmd = f"cd {shlex.quote(self.host.cwd)} && {cmd}"
        return cmd

    def metaltune(self, args: list[str], timeout: Optional[float] = None) -> ssh.Result:
        return self.session.run(self._cmd(["-m", "tuner", *args]), timeout or self.timeout)

    def metaltune_json(self, args: list[str], timeout: Optional[float] = None) -> tuple[int, Any, str]:
        r = self.metaltune(args, timeout)
        try:
            data = json.loads(r.stdout) if r.stdout.strip() else None
        except ValueError:
            data = None
        return r.rc, data, r.stderr.strip()

    def shell(self, command: str, timeout: Optional[float] = None) -> ssh.Result:
        """A user's own health command, run with the host's environment."""
        cmd = ssh.env_prefix(self.host.env) + "sh -c " + shlex.quote(command)
        if self.host.cwd:
            cmd = f"cd {shlex.quote(self.host.cwd)} && {cmd}"
        return self.session.run(cmd, timeout or self.timeout)

    def compare_child(self, args: list[str], timeout: Optional[float] = None) -> dict[str, Any]:
        r = self.session.run(self._cmd(["-m", "tuner.compare.run", "--json", *args]), timeout or self.timeout)
        if r.rc != 0:
            raise ssh.SSHError(f"{self.host.name}: compare child failed (exit {r.rc}): "
                               f"{r.stderr.strip().splitlines()[-1:] }")
        return json.loads(r.stdout)

    def upload_profile(self, local: Path) -> str:
        """Copy a profile file to the host, to a private path named by its content hash. Sent on
        the command's stdin (no SFTP subsystem needed: hardened hosts often disable it)."""
        data = local.read_bytes()
        digest = hashlib.sha256(data).hexdigest()[:16]
        path = f"/tmp/metaltune-fleet/{digest}-{local.name}"
        q = shlex.quote(path)
        r = self.session.run(f"umask 077 && mkdir -p /tmp/metaltune-fleet && cat > {q}.part && "
                             f"mv {q}.part {q}", 60, stdin=data)
        if r.rc != 0:
            raise ssh.SSHError(f"{self.host.name}: cannot upload the profile to {path}: {r.stderr.strip()}")
        return path


def guarded(host: Host, fn: Callable[[], Outcome]) -> Outcome:
    """Run a step, turning SSH failures into an Outcome (an unreachable host is reported, never
    raised)."""
    import time

    t0 = time.monotonic()
    try:
        out = fn()
    except ssh.SSHError as e:
        out = Outcome(host.name, False, e.kind, str(e))
    except Exception as e:  # a bug in one host's step must not stop the others
        out = Outcome(host.name, False, "error", f"{type(e).__name__}: {e}")
    out.seconds = out.seconds or (time.monotonic() - t0)
    return out


def fan_out(hosts: list[Host], step: Callable[[Host], Outcome], parallel: int) -> dict[str, Outcome]:
    """`step` on every host with at most `parallel` at once; results in inventory order."""
    if not hosts:
        return {}
    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(hosts)))) as ex:
        futs = {h.name: ex.submit(guarded, h, lambda h=h: step(h)) for h in hosts}
        return {name: f.result() for name, f in futs.items()}
