"""Transaction: snapshot -> journal intent -> apply -> read back -> probation under the health
monitors -> confirm, or roll back in reverse order and record why.

```python
txn = Transaction(journal, knobs, {"gpu0.power_limit_w": 550}, policy=policy,
                  monitors=monitors, probation_s=30, label="trial 12", key=candidate.key())
with txn:                 # begin(); an exception inside, or leaving without confirm, rolls back
    ... measure ...
    txn.check()           # poll monitors now; a fatal incident rolls back + raises Instability
    txn.confirm()
```
Guarantees: nothing reaches a knob before its intent (and the baseline) is committed; a refused
change never reaches a knob; the watchdog (a separate process by default) rolls back at the
deadline or when the caller dies; a monitor thread rolls back on a fatal incident without waiting
for the caller; every path ends in the journal as confirmed or rolled_back (with the reason).

The deadline covers the measurement: a transaction that writes nothing to the host (every value
already in force, or no knob at all: a kernel or runtime trial) has no deadline in the journal and
no watchdog, since there is nothing to undo (its caller may still wait out the probation,
`remaining()`, and an operator's rollback still ends it); and a caller that is still measuring keeps its change alive with
`check()` when `keepalive_s` is set (each check moves the deadline to at least now + keepalive_s),
so a trial whose A/B outlasts the probation is judged, not rolled back while it is measured. The
watchdog still rolls back when the caller dies, or stops checking for keepalive_s (a hang).
"""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Literal, Mapping, Optional

from safety import _crash
from safety.bounds import probation_seconds
from safety.errors import (ApplyFailed, Instability, PolicyDenied, ProbationExpired, Quarantined,
                           SafetyError)
from safety.incident import Incident
from safety.journal import Journal
from safety.lock import WriterLock
from safety.restore import effect_of, rollback_txn, same

WatchdogMode = Literal["process", "thread", "none"]
NO_PROBATION_GRACE_S = 30.0


class BadChange(SafetyError):
    """A change names a knob that is not there or a value outside the knob's domain."""

    exit_code = 2


def candidate_key(changes: Mapping[str, Any]) -> str:
    return json.dumps({"knobs": dict(changes)}, sort_keys=True, default=str)


class Transaction:
    def __init__(
        self,
        journal: Journal,
        knobs: Mapping[str, Any],
        changes: Mapping[str, Any],
        *,
        policy: Any = None,
        monitors: Iterable[Any] = (),
        probation_s: Optional[float] = None,
        label: str = "",
        key: Optional[str] = None,
        state_dir: Optional[str | os.PathLike[str]] = None,
        watchdog: WatchdogMode = "process",
        knob_factory: Optional[tuple[str, dict[str, Any]]] = None,
        poll_interval_s: Optional[float] = 0.1,
        apply_timeout_s: float = 120.0,
        lock_timeout_s: float = 5.0,
        quarantine_on_fatal: bool = True,
        keepalive_s: Optional[float] = None,
    ):
        self.journal = journal
        self.knobs = knobs
        self.changes = dict(changes)
        self.policy = policy
        self.monitors = list(monitors)
        self.probation_s = probation_s
        self.label = label or ", ".join(f"{k}={v!r}" for k, v in self.changes.items())
        self.key = key if key is not None else candidate_key(self.changes)
        self.state_dir = Path(state_dir) if state_dir is not None else journal.path.parent
        self.watchdog_mode = watchdog
        self.knob_factory = knob_factory
        self.poll_interval_s = poll_interval_s
        self.apply_timeout_s = apply_timeout_s
        self.lock_timeout_s = lock_timeout_s
        self.quarantine_on_fatal = quarantine_on_fatal
        self.keepalive_s = keepalive_s

        self.id: Optional[int] = None
        self.state = "new"  # new -> probation -> confirmed | rolled_back
        self.before: dict[str, Any] = {}
        self.unchanged: list[str] = []  # requested values already in force
        self.after: dict[str, Any] = {}
        self.incidents: list[Incident] = []
        self.fatal: Optional[Incident] = None
        self.rollback_result: Optional[dict[str, Any]] = None
        self.deadline: Optional[float] = None
        self._writes = False  # False: nothing written, nothing for a deadline or watchdog to undo
        self._lock = WriterLock(self.state_dir, role="transaction")
        self._mu = threading.RLock()
        self._wd_pid: Optional[int] = None
        self._wd_proc: Any = None
        self._wd_pipe: Optional[int] = None
        self._wd_stop: Optional[threading.Event] = None
        self._wd_thread: Optional[threading.Thread] = None
        self._broken: set[str] = set()
        self._mon_stop = threading.Event()
        self._mon_thread: Optional[threading.Thread] = None

    # -- begin ------------------------------------------------------------------------------
    def begin(self) -> "Transaction":
        if self.state != "new":
            raise SafetyError(f"transaction {self.id} already begun ({self.state})")
        policy = self._policy()
        self._probation(policy)  # a probation that never ends is refused before anything else
        q = self.journal.is_quarantined(self.key)
        if q is not None:
            raise Quarantined(f"candidate quarantined: {q['reason']} (transaction {q['txn_id']})")
        missing = [n for n in self.changes if n not in self.knobs]
        if missing:
            raise BadChange(f"unknown knob(s) {', '.join(missing)}; this host has: "
                            f"{', '.join(sorted(self.knobs)) or 'none'}")
        try:  # the lock inside: a Ctrl-C as acquire() returns must not leave it held
            self._lock.acquire(timeout=self.lock_timeout_s)
            plan = self._plan(policy)
            self._writes = bool(plan)
            self._journal_intent(plan)
        except BaseException:
            self._lock.release()
            raise
        try:
            self._start_watchdog()
            for m in self.monitors:
                m.arm()
            self._apply_all(plan)
        except BaseException as e:
            res = self._rollback(f"apply_failed: {type(e).__name__}: {e}")
            if isinstance(e, Exception):
                raise ApplyFailed(f"{self.label}: {type(e).__name__}: {e}; "
                                  f"rolled back ({res['state']})") from e
            raise
        try:
            self._enter_probation(policy)
        except BaseException as e:
            # a Ctrl-C (or an error) between the last write and `state = "probation"`: the
            # journal may say probation while this object does not know it. Undo it now, not
            # when the watchdog sees the caller gone, and say so (not "nothing written")
            if self.state not in ("rolled_back", "rollback_failed", "confirmed"):
                try:
                    self._rollback(f"error as probation started: {type(e).__name__}: {e}")
                except Exception:  # noqa: BLE001 - the first error is the one to report;
                    pass  # the watchdog still rolls back at the deadline
            raise
        return self

    def _enter_probation(self, policy: Any) -> None:
        prob = self._probation(policy)
        # probation 0: no monitoring period, confirm at once; the watchdog still undoes the
        # change if the caller never confirms (NO_PROBATION_GRACE_S). The caller's probation
        # (remaining()) runs either way; the journal's deadline, the watchdog's, only when
        # something was written
        self.deadline = time.time() + max(prob if prob > 0 else NO_PROBATION_GRACE_S,
                                          self.keepalive_s or 0.0)
        _crash.point("probation.start")
        if not self.journal.start_probation(self.id, self.deadline if self._writes else None):
            self._finish("rolled_back")
            raise ProbationExpired(f"transaction {self.id}: rolled back during apply "
                                   f"({self.journal.txn(self.id)['reason']})")
        self.state = "probation"
        _crash.point("probation.started")
        if self.monitors and self.poll_interval_s:
            self._mon_thread = threading.Thread(target=self._monitor_loop, daemon=True,
                                                name=f"safety-monitors-{self.id}")
            self._mon_thread.start()

    def _policy(self) -> Any:
        from safety import policy as pol  # pydantic + yaml only when a policy is used

        if self.policy is None:
            self.policy = pol.load_default()
        elif isinstance(self.policy, (str, os.PathLike)):
            self.policy = pol.load(self.policy)
        return self.policy

    def _probation(self, policy: Any) -> float:
        if self.probation_s is not None:
            return probation_seconds(self.probation_s)
        return probation_seconds(policy.probation_for(list(self.changes)), f"{policy.source}: probation_s")

    def _plan(self, policy: Any) -> list[dict[str, Any]]:
        plan = []
        for name, value in self.changes.items():
            k = self.knobs[name]
            validate = getattr(k, "validate", None)
            try:
                before = k.read()
                ident = k.identity()
            except Exception as e:
                raise ApplyFailed(f"{name}: cannot read: {e}") from None
            try:
                after = validate(value) if validate is not None else value
            except Exception as e:
                # the policy's refusal (forbidden, no rule, outside the domain) names its rule
                r = policy.check(k, before, value, self.journal)
                if r is not None:
                    raise PolicyDenied(str(r), [r]) from None
                raise BadChange(f"{name}: {e}") from None
            if effect_of(k) == "now" and same(before, after):
                self.unchanged.append(name)  # already so: nothing to write, journal or limit
                continue
            self.before[name], self.after[name] = before, after
            plan.append({"knob": name, "identity": ident, "effect": effect_of(k),
                         "before": before, "after": after, "value": before})
        policy.enforce(self.knobs, self.after, self.before, self.journal)
        return plan

    def _journal_intent(self, plan: list[dict[str, Any]]) -> None:
        _crash.point("intent.before")
        self.id = self.journal.begin_txn(
            self.label, self.key, plan, plan,
            deadline=(time.time() + self.apply_timeout_s + self._probation(self.policy)
                      if plan else None),
            probation_s=self._probation(self.policy))
        _crash.point("intent.after")

    def _apply_all(self, plan: list[dict[str, Any]]) -> None:
        for p in plan:
            k = self.knobs[p["knob"]]
            _crash.point(f"apply.before:{p['knob']}")
            k.apply(p["after"])  # writes and reads back; raises on a read-back mismatch
            _crash.point(f"apply.after:{p['knob']}")
            self.journal.mark_applied(self.id, p["knob"])
            _crash.point(f"applied:{p['knob']}")

    # -- watchdog ---------------------------------------------------------------------------
    def _start_watchdog(self) -> None:
        from safety import watchdog as wd

        if self.watchdog_mode == "none" or not self._writes:
            return  # nothing was written: there is nothing for a watchdog to roll back
        if self.watchdog_mode == "thread":
            self._wd_stop = threading.Event()
            j = Journal(self.journal.path, verify=False)
            self._wd_thread = threading.Thread(
                target=wd.watch, args=(j, self.id, self.knobs),
                kwargs={"pipe_fd": None, "caller_pid": None, "stop": self._wd_stop},
                daemon=True, name=f"safety-watchdog-{self.id}")
            self._wd_thread.start()
            return
        if self.knob_factory is not None:
            spec, args = self.knob_factory
            self._wd_proc, self._wd_pipe = wd.spawn_watchdog(
                str(self.journal.path), self.id, spec, args, self._lock.fd)
            self._wd_pid = self._wd_proc.pid
        else:
            self._wd_pid, self._wd_pipe = wd.fork_watchdog(str(self.journal.path), self.id,
                                                           self.knobs)
        self.journal.set_watchdog(self.id, self._wd_pid)
        _crash.point("watchdog.started")

    def _stop_watchdog(self) -> None:
        if self._wd_stop is not None:
            self._wd_stop.set()
            if self._wd_thread is not None and self._wd_thread is not threading.current_thread():
                self._wd_thread.join(timeout=5)
            self._wd_stop = None
        if self._wd_pipe is not None:
            try:
                os.write(self._wd_pipe, b"q")
            except OSError:
                pass
            os.close(self._wd_pipe)
            self._wd_pipe = None
        # reap it: the flock it shares is only released when it has exited
        end = time.monotonic() + 5.0
        if self._wd_proc is not None:
            try:
                self._wd_proc.wait(timeout=5.0)
            except Exception:
                self._wd_proc.kill()
                self._wd_proc.wait()
            self._wd_proc = None
        elif self._wd_pid is not None:
            while True:
                pid, _ = os.waitpid(self._wd_pid, os.WNOHANG)
                if pid or time.monotonic() > end:
                    break
                time.sleep(0.002)
            if not pid:
                os.kill(self._wd_pid, 9)
                os.waitpid(self._wd_pid, 0)
        self._wd_pid = None

    # -- probation --------------------------------------------------------------------------
    def _monitor_loop(self) -> None:
        while not self._mon_stop.wait(self.poll_interval_s):
            try:
                self._poll()
            except Exception:
                pass  # a broken monitor must not kill the loop; check() surfaces errors
            if self.state != "probation":
                return

    def _poll(self) -> list[Incident]:
        with self._mu:
            if self.state != "probation":
                return []
            new: list[Incident] = []
            for m in self.monitors:
                try:
                    found = list(m.poll())
                except Exception as e:
                    # a broken monitor must not blind the others; say so once per transaction
                    name = getattr(m, "name", type(m).__name__)
                    if name in self._broken:
                        continue
                    self._broken.add(name)
                    found = [Incident("monitor_error", "warning", f"{name}: {type(e).__name__}: {e}",
                                      source=name)]
                for inc in found:
                    inc.txn_id = self.id
                    inc.knob = inc.knob or ",".join(self.changes)
                    self.journal.add_incident(inc)
                    self.incidents.append(inc)
                    new.append(inc)
            fatal = next((i for i in new if i.fatal), None)
            if fatal is not None:
                self.fatal = fatal
                if self.quarantine_on_fatal:
                    self.journal.quarantine(self.key, f"{fatal.reason}: {fatal}", fatal.id, self.id)
                self._rollback(f"{fatal.reason}: {fatal}")
            return new

    def check(self) -> list[Incident]:
        """Poll the monitors now. Returns non-fatal incidents; raises Instability after a fatal
        one (already rolled back) and ProbationExpired when the watchdog rolled back."""
        _crash.point("probation.check")
        new = self._poll()
        self._raise_if_gone()
        self._keep_alive()
        return new

    def _keep_alive(self) -> None:
        """The caller is alive and still measuring: the deadline moves to now + keepalive_s."""
        if not self.keepalive_s or self.deadline is None or self.state != "probation":
            return
        want = time.time() + self.keepalive_s
        if want > self.deadline + self.keepalive_s / 4:  # a journal write per quarter keepalive
            if not self._writes or self.journal.extend_deadline(self.id, want):
                self.deadline = want

    def _raise_if_gone(self) -> None:
        if self.fatal is not None:
            raise Instability(self.fatal)
        if self.state == "probation":
            st = self.journal.txn_state(self.id)
            if st in ("rolling_back", "rolled_back", "rollback_failed"):
                self._rollback("probation_expired")  # waits for the other side's result
            elif st == "confirmed":  # `metaltune confirm` from another process
                with self._mu:
                    self._finish("confirmed")
                return
        if self.state in ("rolled_back", "rollback_failed"):
            t = self.journal.txn(self.id)
            raise ProbationExpired(f"transaction {self.id} was rolled back: {t['reason']}")

    def remaining(self) -> float:
        """Seconds of probation left; 0 once the transaction is resolved (here or elsewhere)."""
        if self.state == "probation":
            self._raise_if_gone_quiet()
        if self.state != "probation":
            return 0.0
        return max(0.0, (self.deadline or 0) - time.time())

    def _raise_if_gone_quiet(self) -> None:
        try:
            self._raise_if_gone()
        except SafetyError:
            pass

    def confirm(self, reason: str = "probation passed") -> None:
        if self.state == "confirmed":
            return
        self.check()  # an incident seen now still wins over the confirmation
        if self.state == "confirmed":  # confirmed meanwhile by the operator
            return
        if self._writes and self.deadline is not None and time.time() > self.deadline and \
                self._probation(self.policy) > 0:
            # the watchdog may not have acted yet: the deadline is the deadline, not a race
            self._rollback(f"probation_expired: not confirmed within {self._probation(self.policy):g}s")
            self._raise_if_gone()
        with self._mu:
            _crash.point("confirm.before")
            ok = self.journal.confirm(self.id, reason)
            _crash.point("confirm.after")
            if not ok:
                self._raise_if_gone()
                raise ProbationExpired(f"transaction {self.id}: not in probation")
            self.state = "confirmed"
            self._finish("confirmed")

    def rollback(self, why: str = "rolled back by the caller") -> dict[str, Any]:
        if self.state in ("rolled_back", "rollback_failed"):
            return self.rollback_result or {}
        if self.state == "confirmed":
            raise SafetyError(f"transaction {self.id} is confirmed; use rollback_to_baseline")
        return self._rollback(why)

    def _rollback(self, why: str) -> dict[str, Any]:
        with self._mu:
            if self.state in ("rolled_back", "rollback_failed"):
                return self.rollback_result or {}
            for m in self.monitors:  # a canary still running on the device must not race the restore
                try:
                    getattr(m, "stop", lambda: None)()
                except Exception:
                    pass
            res = rollback_txn(self.journal, self.knobs, self.id, why)
            self.rollback_result = res
            self._finish(res["state"])
            return res

    def _finish(self, state: str) -> None:
        self.state = state
        self._mon_stop.set()
        for m in self.monitors:
            try:
                getattr(m, "stop", lambda: None)()
            except Exception:
                pass
        self._stop_watchdog()
        self._lock.release()

    # -- context manager --------------------------------------------------------------------
    def __enter__(self) -> "Transaction":
        if self.state == "new":
            self.begin()
        return self

    def __exit__(self, et: Any, ev: Any, tb: Any) -> None:
        if self.state == "probation":
            self._rollback(f"error: {et.__name__}: {ev}" if et is not None
                           else "left without confirm")


def transaction(journal: Journal, knobs: Mapping[str, Any], changes: Mapping[str, Any],
                **kw: Any) -> Transaction:
    return Transaction(journal, knobs, changes, **kw)
