"""The host's active profile, kept in force: NVML settings do not survive a driver reload or a
reboot, so at start (and when a reload names another profile) the daemon verifies it and puts it
back, in a thread (its probation can last minutes; the daemon serves status and pings the
watchdog meanwhile; writes wait for it)."""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Optional

from tuner.daemon import logs


class ActiveProfile:
    def __init__(self, name: Optional[str], call: Callable[..., dict[str, Any]],
                 writer: threading.RLock, config: Callable[[], Any], changed: Callable[[], None]):
        """`call(op, **kw)`: an operation in the daemon's process; `changed`: after the apply."""
        self.call, self.writer, self.config, self.changed = call, writer, config, changed
        self.state: dict[str, Any] = {"profile": name, "applied": None, "verified": None}
        self._thread: Optional[threading.Thread] = None

    def renamed(self, name: Optional[str]) -> None:
        self.state = {"profile": name, "applied": None, "verified": None}
        if name:
            self.start()

    def start(self) -> None:
        def work() -> None:
            with self.writer:
                self._apply()
                self.changed()

        self.state.update(applied="in progress", verified=None)
        self._thread = threading.Thread(target=work, name="profile-apply", daemon=True)
        self._thread.start()

    def rolled_back(self, reason: str) -> None:
        self.state.update(verified=False, rolled_back=reason)

    def _apply(self) -> None:
        """Verified already (a daemon restart): nothing is written."""
        cfg = self.config()
        name = cfg.profile
        if not name:
            return
        try:
            v = self.call("verify", profile=name)
            if verified(v):
                self.state.update(applied="already", verified=True)
                logs.log("profile.verified", profile=name, result="ok", note="already in force")
                return
            logs.log("profile.applying", profile=name, reason="active profile not in force",
                     drifted=[k.get("knob") for k in v.get("knobs", []) if k.get("status") == "drifted"])
            res = self.call("apply", profile=name, probation_s=cfg.probation_s,
                            policy=None if cfg.policy is None else str(cfg.policy))
            logs.log("profile.applied", profile=name, reason="re-applied at start", **logs.summary(res))
            v = self.call("verify", profile=name)
            ok = verified(v)
            self.state.update(applied=time.time(), verified=ok)
            logs.log("profile.verified", level="info" if ok else "error", profile=name,
                     result="ok" if ok else "mismatch", **logs.summary(v))
        except Exception as e:  # the host stays as recovered; the daemon keeps serving
            self.state.update(verified=False, error=f"{e}")
            logs.log("profile.failed", level="error", profile=name, error=str(e),
                     kind=type(e).__name__, bad_input=getattr(e, "exit_code", 1) == 2)


def verified(v: Any) -> bool:
    if not isinstance(v, dict):
        return False
    for k in ("ok", "verified", "match", "matches"):
        if k in v:
            return bool(v[k])
    return False
