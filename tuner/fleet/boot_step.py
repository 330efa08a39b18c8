"""`fleet apply` with boot-time settings (`boot.cmdline.*` in the profile): before a host's apply,
the operator's drain hook runs on the controller (`--drain-cmd`, e.g. `kubectl drain {host}`), the
host tries the values with `metaltune boot try` (a one-shot boot, docs/boot-trials.md), and the
controller waits for that host's gate after the reboot (`boot status` until the trial is final,
the host unreachable meanwhile). Only a promoted trial goes on to the rest of the apply; the wave
waits for every host's gate, so the next wave starts only after them. `--undrain-cmd` runs once
the host is healthy again (a failed host stays drained for the operator)."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Optional

FINAL = ("promoted", "rolled_back", "lost", "aborted")
POLL_S = 2.0


def values(profile: Optional[Path]) -> dict[str, Any]:
    """The profile's boot-time values (its own `knobs:`; a local file)."""
    import yaml

    if profile is None:
        return {}
    try:
        doc = yaml.safe_load(profile.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return {}  # `apply` on the host reports a broken profile with its line
    knobs = doc.get("knobs") if isinstance(doc, dict) else None
    return {k: v for k, v in (knobs or {}).items() if isinstance(k, str) and k.startswith("boot.")}


def hook(cmd: Optional[str], host: str, timeout: float) -> Optional[str]:
    """Run the operator's hook on the controller ({host} replaced, METALTUNE_HOST set); the
    error, or None when it exited 0 (or there is none)."""
    if not cmd:
        return None
    try:
        r = subprocess.run(cmd.replace("{host}", shlex.quote(host)), shell=True, text=True,
                           capture_output=True, timeout=timeout,
                           env={**os.environ, "METALTUNE_HOST": host})
    except subprocess.TimeoutExpired:
        return f"`{cmd}` did not finish in {timeout:g} s"
    if r.returncode:
        return f"`{cmd}` exited {r.returncode}: {(r.stderr or r.stdout).strip()[-200:]}"
    return None


def _word(k: str, v: Any) -> str:
    return f"{k}={'null' if v is None else json.dumps(v) if isinstance(v, bool) else v}"


def try_and_wait(remote: Callable[[], Any], vals: dict[str, Any], timeout_s: float,
                 gate_timeout_s: float, log: Callable[[str], None]) -> tuple[bool, str]:
    """(promoted, what happened). `remote()` opens a fresh session: the host reboots between."""
    r = remote()
    try:
        res = r.metaltune(["boot", "try", *[_word(k, v) for k, v in vals.items()], "--json"],
                          timeout_s)
    finally:
        r.close()
    if res.rc != 0:
        return False, f"boot try failed (exit {res.rc}): {(res.stderr or res.stdout).strip()[-300:]}"
    trial = json.loads(res.stdout).get("trial")
    log(f"{r.host.name}: boot trial #{trial} armed; waiting for its gate after the reboot")
    deadline = time.monotonic() + gate_timeout_s
    while time.monotonic() < deadline:
        time.sleep(POLL_S)
        try:
            r = remote()
            try:
                rc, st, _ = r.metaltune_json(["boot", "status", "--json"], 60)
            finally:
                r.close()
        except Exception:  # rebooting: unreachable for a while
            continue
        if rc != 0 or not isinstance(st, dict):
            continue
        t = next((x for x in st.get("trials") or [] if x.get("id") == trial), None)
        if t and t.get("state") in FINAL:
            return t["state"] == "promoted", f"boot trial #{trial}: {t['state']}: {t.get('reason')}"
    return False, f"boot trial #{trial} not decided within {gate_timeout_s:g} s (--gate-timeout)"
