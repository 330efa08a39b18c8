"""Compare targets and how their child runs: `local` (this machine), `sim://DIR` (a simulated host
folder) and `ssh://user@host[:port][?python=PY&cwd=DIR&sim=DIR]` (a remote host: the same module
run there through paramiko, host key verified). Each yields the child's JSON document."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from safety import pychild
from tuner.errors import BadInput, OperationFailed

CHILD = ["-m", "tuner.compare.run", "--json"]
_QUERY_KEYS = {"python", "cwd", "sim"}


@dataclass
class Target:
    kind: str                      # local | sim | ssh
    label: str
    path: Path | None = None       # sim root (sim) / remote sim root (ssh)
    user: str = "root"
    host: str = ""
    port: int = 22
    python: str = "python3"
    cwd: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def parse(spec: str) -> Target:
    """One TARGET argument, or BadInput naming what was expected."""
    if spec == "local":
        return Target("local", "local")
    if spec.startswith("sim://"):
        p = Path(spec[len("sim://"):]).expanduser()
        if not str(p) or not (p / "host.json").is_file():
            raise BadInput(f"TARGET {spec!r}: expected sim://DIR where DIR is a simulated host "
                           f"(made by `metaltune sim init DIR`); {p}/host.json not found")
        return Target("sim", spec, path=p.resolve())
    if spec.startswith("ssh://"):
        u = urlsplit(spec)
        if not u.hostname:
            raise BadInput(f"TARGET {spec!r}: expected ssh://user@host[:port]")
        try:
            port = u.port or 22
        except ValueError:
            raise BadInput(f"TARGET {spec!r}: port must be a number 1-65535") from None
        q = {k: v[-1] for k, v in parse_qs(u.query).items()}
        bad = set(q) - _QUERY_KEYS
        if bad:
            raise BadInput(f"TARGET {spec!r}: unknown option(s) {sorted(bad)}; expected {sorted(_QUERY_KEYS)}")
        label = f"ssh://{u.username + '@' if u.username else ''}{u.hostname}{':' + str(u.port) if u.port else ''}"
        return Target("ssh", label, path=Path(q["sim"]) if "sim" in q else None, user=u.username or "root",
                      host=u.hostname, port=port, python=q.get("python", "python3"), cwd=q.get("cwd"))
    raise BadInput(f"TARGET {spec!r}: expected 'local', 'sim://DIR' or 'ssh://user@host[:port]'")


def child_args(repeats: int, quick: bool, only: list[str] | None, seed: int | None,
               serving: str | None = None) -> list[str]:
    a = ["--repeats", str(repeats)]
    if serving is not None:
        a += ["--serving", serving]
    if quick:
        a.append("--quick")
    if only:
        a += ["--only", ",".join(only)]
    if seed is not None:
        a += ["--seed", str(seed)]
    return a


def _decode(label: str, rc: int, out: str, err: str) -> dict[str, Any]:
    if rc != 0:
        tail = err.strip().splitlines()[-5:]
        raise OperationFailed(f"{label}: benchmark child failed (exit {rc}): {' | '.join(tail)}")
    try:
        return json.loads(out)
    except ValueError:
        raise OperationFailed(f"{label}: benchmark child printed no JSON ({out[:200]!r})") from None


def run(t: Target, args: list[str], timeout: float = 900.0,
        ssh_opts: dict[str, Any] | None = None) -> dict[str, Any]:
    """The child's JSON document for target `t` (OperationFailed / SSHError when it cannot run)."""
    if t.kind in ("local", "sim"):
        argv = pychild.argv(CHILD[1], *CHILD[2:], *args)
        env = dict(os.environ)
        env.pop("METALTUNE_SIM_ROOT", None)
        if t.kind == "sim":
            argv += ["--sim-root", str(t.path)]
        # the repo's package even when metaltune is not installed into this interpreter
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                               env=pychild.env(env))
        except subprocess.TimeoutExpired:
            raise OperationFailed(f"{t.label}: benchmark child timed out after {timeout:.0f}s") from None
        return _decode(t.label, p.returncode, p.stdout, p.stderr)
    from tuner.fleet import ssh

    o = ssh_opts or {}
    st = ssh.SSHTarget(t.host, t.port, t.user, key=o.get("key"), known_hosts=o.get("known_hosts"),
                       trust_new=bool(o.get("trust_new")), connect_timeout=o.get("connect_timeout", 10.0))
    cmd = shlex.join([t.python, *CHILD, *args] + (["--sim-root", str(t.path)] if t.path else []))
    if t.cwd:
        cmd = f"cd {shlex.quote(t.cwd)} && {cmd}"
    with ssh.Session(st) as s:
        r = s.run(cmd, timeout=timeout)
    return _decode(t.label, r.rc, r.stdout, r.stderr)
