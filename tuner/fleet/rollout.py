"""Rolling a profile out to a fleet: canary hosts first, then waves.

Per wave (hosts in parallel, at most `parallel` at once):
  1. preflight: `metaltune status --json` (reachable, no change pending confirmation; the
     incidents already on record, so that only new ones count);
  2. optional baseline measurement of one compare metric (the regression check);
  3. `metaltune apply PROFILE --probation S`: the host applies through its safety transaction,
     watches its health monitors for S seconds (an incident rolls the change back there and apply
     exits 1), then confirms;
  4. health check: `metaltune status --json` (no new incident), `metaltune verify PROFILE --json`
     (every knob as the profile says), the user's `--health-cmd` (exit 0), and the metric again:
     a drop beyond `tolerance` whose confidence interval excludes "no change" is a regression;
  5. all healthy: the wave is done. Any host failed: HALT — every host of this wave that applied is
     rolled back (`metaltune rollback`: every knob metaltune changed returns to its baseline),
     later waves are not touched.
An unreachable host is reported (state `unreachable`): the wave goes on without it and a later
resume retries it; except a canary: no wave starts before every canary host was verified (an
unreachable canary halts the rollout before wave 1; nothing to roll back, `--resume-halted`
retries the canary), as deploy/ansible/rollout.yml does.

The rollout's state is a JSON file written atomically after every host transition, so a killed
`fleet apply` resumes where it stopped (`--state FILE`); a halted rollout resumes only with
`resume_halted` (after the operator has dealt with the cause), retrying the halted wave.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from tuner.errors import BadInput
from tuner.fleet import boot_step
from tuner.fleet.inventory import Host
from tuner.fleet.remote import Outcome, Remote, fan_out

SCHEMA = "metaltune.fleet.rollout/1"
#: host states; `done` states are not re-run on resume
PENDING, APPLIED, DONE, FAILED, ROLLED_BACK, UNREACHABLE, REFUSED = (
    "pending", "applied", "done", "failed", "rolled_back", "unreachable", "refused")
#: not reached at all: reported, never fatal, retried on resume
SKIPPED_STATES = (UNREACHABLE, REFUSED)


@dataclass
class Options:
    canary: int = 1
    wave_size: int = 0              # 0: everything after the canaries in one wave
    probation_s: float = 30.0
    parallel: int = 8
    health_cmd: Optional[str] = None
    metric: Optional[str] = None    # e.g. decode_tok_s: measured before and after on each host
    tolerance: float = 0.02         # allowed relative drop of `metric`
    repeats: int = 5
    trust_new: bool = False
    timeout_s: float = 900.0
    #: boot-time settings (tuner.fleet.boot_step): hooks run on the controller around the trial
    drain_cmd: Optional[str] = None
    undrain_cmd: Optional[str] = None
    gate_timeout_s: float = 1800.0


def plan_waves(names: list[str], canary: int, wave_size: int) -> list[list[str]]:
    if canary < 0 or wave_size < 0:
        raise BadInput("--canary and --wave-size: expected 0 or more")
    waves = [names[:canary]] if canary else []
    rest = names[canary:]
    step = wave_size or len(rest) or 1
    waves += [rest[i:i + step] for i in range(0, len(rest), step)]
    return [w for w in waves if w]


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


class RolloutState:
    """The durable record of one rollout (atomic JSON writes, one lock for the worker threads)."""

    def __init__(self, path: Path, doc: dict[str, Any]) -> None:
        self.path, self.doc = path, doc
        self._lock = threading.Lock()

    @classmethod
    def create(cls, path: Path, profile: Path, profile_ref: str, inventory: Path, waves: list[list[str]],
               opts: Options) -> "RolloutState":
        doc = {
            "schema": SCHEMA, "created": _now(), "updated": _now(), "status": "running",
            "profile": profile_ref, "profile_sha256": _sha(profile) if profile.is_file() else None,
            "inventory": str(inventory), "options": opts.__dict__, "waves": waves, "current_wave": 0,
            "halt_reason": None,
            "hosts": {n: {"state": PENDING, "wave": i, "detail": "", "history": []}
                      for i, w in enumerate(waves) for n in w},
        }
        st = cls(path, doc)
        st.save()
        return st

    @classmethod
    def load(cls, path: Path) -> "RolloutState":
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise BadInput(f"rollout state {path}: cannot read ({e})") from None
        if doc.get("schema") != SCHEMA:
            raise BadInput(f"rollout state {path}: field schema: expected {SCHEMA!r}, got {doc.get('schema')!r}")
        return cls(path, doc)

    def save(self) -> None:
        self.doc["updated"] = _now()
        tmp = self.path.with_name(self.path.name + ".tmp")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "w") as f:
            json.dump(self.doc, f, indent=1, default=str)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(self.path)

    def lock(self) -> Any:
        """Hold an exclusive lock next to the state file for the whole run: two controllers on
        one rollout would apply twice and fight over its record."""
        import fcntl

        from tuner.errors import OperationFailed

        from safety.securefs import UnsafePath, open_file

        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:  # not "w": opening a planted symlink that way would truncate its target
            fd = open_file(self.path.with_name(self.path.name + ".lock"), os.O_WRONLY | os.O_CREAT)
        except UnsafePath as e:
            raise OperationFailed(str(e)) from None
        f = os.fdopen(fd, "w")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            raise OperationFailed(f"rollout state {self.path}: another `fleet apply` is running it") from None
        return f

    def set_host(self, name: str, state: str, detail: str = "", **extra: Any) -> None:
        with self._lock:
            h = self.doc["hosts"][name]
            h["state"], h["detail"] = state, detail
            h.update(extra)
            h["history"].append({"at": _now(), "state": state, "detail": detail[:500]})
            self.save()

    def host(self, name: str) -> dict[str, Any]:
        return self.doc["hosts"][name]


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


class Rollout:
    def __init__(self, hosts: list[Host], profile: str, state: RolloutState, opts: Options,
                 log: Callable[[str], None] = lambda s: None) -> None:
        self.hosts = {h.name: h for h in hosts}
        self.profile = profile
        self.local_profile = Path(profile) if Path(profile).is_file() else None
        self.state, self.opts, self.log = state, opts, log

    # -- one host's steps ---------------------------------------------------------------------
    def _remote(self, h: Host) -> Remote:
        return Remote(h, self.opts.trust_new, self.opts.timeout_s)

    def _profile_arg(self, r: Remote) -> str:
        return r.upload_profile(self.local_profile) if self.local_profile else self.profile

    def _measure(self, r: Remote) -> list[float]:
        doc = r.compare_child(["--only", self.opts.metric, "--repeats", str(self.opts.repeats)])
        m = next(m for m in doc["metrics"] if m["name"] == self.opts.metric)
        if m.get("skipped") or m.get("error"):
            raise RuntimeError(f"metric {self.opts.metric}: {m.get('skipped') or m.get('error')}")
        return list(m["samples"])

    def _apply_one(self, h: Host) -> Outcome:
        st = self.state
        r = self._remote(h)
        stage = "preflight"
        try:
            rc, status, err = self._settled_status(r)
            if rc != 0:
                st.set_host(h.name, FAILED, f"preflight: status failed: {err[-300:]}")
                return Outcome(h.name, False, "failed", "preflight status failed")
            open_change = _unconfirmed(status)
            if open_change:
                st.set_host(h.name, FAILED, f"preflight: host has an unconfirmed change ({open_change})")
                return Outcome(h.name, False, "failed", "unconfirmed change on host")
            seen = _incident_keys(status)
            before = self._measure(r) if self.opts.metric else None
            boot = boot_step.values(self.local_profile)
            if boot:  # drain, a one-shot boot, and its gate before anything else
                stage = "boot"
                why = boot_step.hook(self.opts.drain_cmd, h.name, self.opts.timeout_s)
                ok, what = (False, f"drain hook: {why}") if why else boot_step.try_and_wait(
                    lambda: self._remote(h), boot, self.opts.timeout_s, self.opts.gate_timeout_s,
                    self.log)
                if not ok:
                    st.set_host(h.name, FAILED, what, applied=False)
                    return Outcome(h.name, False, "failed", what)
                self.log(f"{h.name}: {what}")
                r.close()
                r = self._remote(h)  # the host rebooted: a new session
            prof = self._profile_arg(r)
            stage = "apply"
            res = r.metaltune(["apply", prof, "--probation", _secs(self.opts.probation_s)],
                              self.opts.probation_s + self.opts.timeout_s)
            if res.rc != 0:
                # the host's own transaction has rolled back (incident, rejection or failure)
                why = _last_line(res.stderr) or _last_line(res.stdout)
                st.set_host(h.name, FAILED, f"apply failed (exit {res.rc}): {why}", applied=False)
                return Outcome(h.name, False, "failed", why, rc=res.rc)
            st.set_host(h.name, APPLIED, "applied; health check", applied=True, profile_path=prof)
            problems = self._health(r, prof, seen)
            extra: dict[str, Any] = {}
            if self.opts.metric and before is not None:
                after = self._measure(r)
                from tuner.compare.suite import METRICS

                verdict = _regression(before, after, self.opts.tolerance, METRICS[self.opts.metric][1])
                extra = {"metric": self.opts.metric, "before": before, "after": after, **verdict}
                if verdict["regression"]:
                    problems.append(f"regression in {self.opts.metric}: ratio {verdict['ratio']:.3f} "
                                    f"[{verdict['low']:.3f}, {verdict['high']:.3f}]")
            if problems:
                st.set_host(h.name, FAILED, "; ".join(problems), applied=True, **extra)
                return Outcome(h.name, False, "failed", "; ".join(problems))
            if boot:
                why = boot_step.hook(self.opts.undrain_cmd, h.name, self.opts.timeout_s)
                if why:
                    st.set_host(h.name, FAILED, f"undrain hook: {why}", applied=True, **extra)
                    return Outcome(h.name, False, "failed", f"undrain hook: {why}")
            st.set_host(h.name, DONE, "applied and healthy", applied=True, **extra)
            return Outcome(h.name, True, "ok", "applied and healthy")
        except Exception as e:
            kind = getattr(e, "kind", None)
            if stage == "preflight" and kind in ("unreachable", "timeout"):
                st.set_host(h.name, UNREACHABLE, str(e), kind=kind)
            elif stage == "preflight" and kind in ("host_key_rejected", "auth_failed"):
                st.set_host(h.name, REFUSED, str(e), kind=kind)
            else:  # lost during or after apply: its state is unknown, so this halts the wave
                st.set_host(h.name, FAILED, f"{stage}: {type(e).__name__}: {e}", kind=kind or "error")
            raise
        finally:
            r.close()

    def _settled_status(self, r: Remote) -> tuple[int, Any, str]:
        """`status --json`, waiting while a change is still on probation there (a resumed
        rollout can find the host still finishing the apply of a killed controller)."""
        import time

        deadline = time.monotonic() + self.opts.probation_s + 30
        while True:
            rc, status, err = r.metaltune_json(["status", "--json"], 120)
            if rc != 0 or not _unconfirmed(status) or time.monotonic() > deadline:
                return rc, status, err
            self.log(f"{r.host.name}: waiting for the change on probation there to settle")
            time.sleep(2)

    def _health(self, r: Remote, prof: str, seen: set[str]) -> list[str]:
        problems = []
        rc, status, err = r.metaltune_json(["status", "--json"], 120)
        if rc != 0 or status is None:
            problems.append(f"status failed after apply: {err[-200:]}")
        else:
            new = _new_incidents(status, seen)
            if new:
                problems.append(f"incident since apply: {new}")
            if status.get("pending"):
                problems.append("a change is still pending confirmation after apply")
        rc, ver, err = r.metaltune_json(["verify", prof, "--json"], 120)
        if rc != 0:
            problems.append(f"verify: {_verify_summary(ver) or err[-200:]}")
        if self.opts.health_cmd:
            res = r.shell(self.opts.health_cmd, self.opts.timeout_s)
            if res.rc != 0:
                problems.append(f"health command exit {res.rc}: {_last_line(res.stderr) or _last_line(res.stdout)}")
        return problems

    def _rollback_one(self, h: Host) -> Outcome:
        r = self._remote(h)
        try:
            res = r.metaltune(["rollback"], self.opts.timeout_s)
            ok = res.rc == 0
            detail = "rolled back" if ok else f"rollback failed (exit {res.rc}): {_last_line(res.stderr)}"
            prev = self.state.host(h.name)["detail"]
            self.state.set_host(h.name, ROLLED_BACK if ok else FAILED, f"{detail} (was: {prev})")
            return Outcome(h.name, ok, "ok" if ok else "failed", detail, rc=res.rc)
        finally:
            r.close()

    # -- the waves ----------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        doc = self.state.doc
        for wi in range(doc["current_wave"], len(doc["waves"])):
            doc["current_wave"] = wi
            self.state.save()
            todo = [n for n in doc["waves"][wi] if self.state.host(n)["state"] != DONE]
            label = "canary" if wi == 0 and self.opts.canary else f"wave {wi}"
            self.log(f"{label}: {', '.join(todo) or 'nothing to do'}")
            results = fan_out([self.hosts[n] for n in todo], self._apply_one, self.opts.parallel)
            failed = [n for n, o in results.items()
                      if not o.ok and self.state.host(n)["state"] not in SKIPPED_STATES]
            if failed:
                applied = [n for n in doc["waves"][wi]
                           if self.state.host(n).get("applied") and self.state.host(n)["state"] in (DONE, APPLIED, FAILED)]
                self.log(f"{label}: {', '.join(failed)} failed: halting; rolling back {', '.join(applied) or 'nothing'}")
                fan_out([self.hosts[n] for n in applied], self._rollback_one, self.opts.parallel)
                doc["status"] = "halted"
                doc["halt_reason"] = "; ".join(f"{n}: {self.state.host(n)['detail']}" for n in failed)
                self.state.save()
                return doc
            missed = [n for n in doc["waves"][wi] if self.state.host(n)["state"] in SKIPPED_STATES]
            if wi == 0 and self.opts.canary and missed and wi + 1 < len(doc["waves"]):
                # a wave after an unverified canary would be a rollout with no canary at all
                self.log(f"canary: {', '.join(missed)} not reached: halting before wave 1")
                doc["status"] = "halted"
                doc["halt_reason"] = "; ".join(
                    f"canary {n} not reached: {self.state.host(n)['detail']}" for n in missed)
                self.state.save()
                return doc
        unreachable = [n for n, h in doc["hosts"].items() if h["state"] in SKIPPED_STATES]
        doc["status"] = "incomplete" if unreachable else "done"
        doc["current_wave"] = len(doc["waves"]) if not unreachable else _first_wave_of(doc, unreachable)
        self.state.save()
        return doc


def _first_wave_of(doc: dict[str, Any], names: list[str]) -> int:
    return min(doc["hosts"][n]["wave"] for n in names)


def prepare_resume(state: RolloutState, resume_halted: bool) -> None:
    """Make a stopped rollout runnable again: halted waves only when asked; rolled-back, failed
    and unreachable hosts of the current wave go back to pending."""
    doc = state.doc
    if doc["status"] == "done":
        return
    if doc["status"] == "halted" and not resume_halted:
        raise BadInput(f"rollout state {state.path}: halted ({doc['halt_reason']}); fix the cause, "
                       f"then resume with --resume-halted, or start a new rollout with another --state")
    for n, h in doc["hosts"].items():
        if h["state"] in (ROLLED_BACK, FAILED, APPLIED, *SKIPPED_STATES):
            h["state"] = PENDING
            h["applied"] = False
    doc["status"] = "running"
    doc["halt_reason"] = None
    state.save()


def _secs(s: float) -> str:
    return str(int(s)) if float(s).is_integer() else str(s)


def _last_line(s: str) -> str:
    lines = [x for x in (s or "").strip().splitlines() if x.strip()]
    return lines[-1][-300:] if lines else ""


def _unconfirmed(status: Any) -> Optional[str]:
    """The change pending confirmation that `metaltune status --json` reports, if any."""
    p = status.get("pending") if isinstance(status, dict) else None
    if not p:
        return None
    return f"transaction {p.get('txn')} {p.get('label', '')!r} ({p.get('state')})"


def _incident_key(i: dict[str, Any]) -> str:
    return json.dumps([i.get("time"), i.get("type"), i.get("txn_id"), i.get("detail")], default=str)


def _incident_keys(status: Any) -> set[str]:
    incs = status.get("incidents") if isinstance(status, dict) else None
    return {_incident_key(i) for i in incs or [] if isinstance(i, dict)}


def _new_incidents(status: Any, seen: set[str]) -> Optional[str]:
    """Incidents in `status` that were not there at preflight (the apply's own, or later)."""
    incs = status.get("incidents") if isinstance(status, dict) else None
    new = [i for i in incs or [] if isinstance(i, dict) and _incident_key(i) not in seen]
    if not new:
        return None
    return "; ".join(f"{i.get('type')} {i.get('detail', '')}"[:150] for i in new)


def _verify_summary(ver: Any) -> str:
    if not isinstance(ver, dict):
        return ""
    bad = [k for k in ver.get("knobs", []) if isinstance(k, dict) and k.get("status") not in ("ok", None)]
    return ", ".join(f"{k.get('knob')}={k.get('status')}" for k in bad)[:300]


def _regression(before: list[float], after: list[float], tol: float, higher_is_better: bool = True
                ) -> dict[str, Any]:
    """Worse by more than `tol` (after/before), with the 95% bootstrap interval wholly on the worse
    side of 1: a real regression, not noise."""
    from tuner.compare.stats import ratio_ci

    ci = ratio_ci(before, after)
    if higher_is_better:
        bad = ci.high < 1.0 and ci.ratio < 1.0 - tol
    else:
        bad = ci.low > 1.0 and ci.ratio > 1.0 + tol
    return {"ratio": ci.ratio, "low": ci.low, "high": ci.high, "regression": bad}
