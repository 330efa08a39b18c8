"""The daemon's life: start (recover, detect, re-apply + verify the active profile), serve the
control socket, watch health, attribute incidents and roll back, run scheduled searches in a child
process, reload on SIGHUP, stop per the stop policy on SIGTERM.

Threads: the main thread runs the loop (watchdog pings, health ticks, the search scheduler);
each control client has a thread. `self.writer` serialises every write in this process (socket
operations, incident rollbacks, starting a search); safety's WriterLock (held for the daemon's
life, handed to a search child while it runs) keeps other processes out.
"""
from __future__ import annotations

import fcntl
import inspect
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

from tuner import ops
from tuner.daemon import check, health, logs, schedule, searches
from tuner.daemon.client import NO_DAEMON_ENV
from tuner.daemon.config import DaemonConfig, load
from tuner.daemon.mirror import JournalMirror
from tuner.daemon.notify import Notifier
from tuner.errors import BadInput, MetaltuneError, OperationFailed

#: operations that only read: they run concurrently, without the writer lock
READ_OPS = frozenset({"status", "verify", "trials", "trial_stats", "diagnose", "profile_list",
                      "profile_show", "profile_diff", "profile_export", "daemon"})
#: an incident seen again within this many seconds (another monitor, the transaction's own
#: monitors) is the same event
DEDUP_S = 10.0

#: how long a write request waits for another write (or a search) before "busy"
WRITE_WAIT_S = 30.0
#: searches never run inside the daemon: a child process gets the writer lock for the run
SEARCH_OPS = frozenset({"search_host", "search_kernel", "search_mixed"})
DAEMON_OPS = ("daemon", "search_stop")


class Daemon:
    def __init__(self, cfg: DaemonConfig, cfg_path: Path, notifier: Optional[Notifier] = None):
        self.cfg = cfg
        self.cfg_path = cfg_path
        self.notifier = notifier or Notifier()
        self.stop_event = threading.Event()   # SIGTERM/SIGINT: stop for good
        self.reload_flag = threading.Event()  # SIGHUP: reload the configuration
        self.wake = threading.Event()         # either of them: the loop wakes up now
        self.writer = threading.RLock()
        self.started = time.time()
        self.phase = "starting"
        self.host: Any = None
        self.gpus: list[dict[str, Any]] = []
        self.monitors: list[Any] = []
        self.metrics: Any = None
        self.server: Any = None
        self.idle = schedule.IdleTracker()
        self.mirror = JournalMirror(self.journal, lambda: self.metrics)
        self.profile_state: dict[str, Any] = {"profile": cfg.profile, "applied": None, "verified": None}
        self.search: Optional[searches.SearchChild] = None
        self.search_info: dict[str, Any] = {}
        self._wlock: Any = None
        self._daemon_lock_fd: Optional[int] = None
        self._last_status = ""
        self._monitor_errors: dict[str, float] = {}
        self._profile_thread: Optional[threading.Thread] = None
        self._journal: Any = None
        #: fatal incidents whose rollback is still to run: incident id -> {reason, txn}; also in
        #: the journal (incidents.action), so a restart picks them up again
        self._pending_rollbacks: dict[int, dict[str, Any]] = {}
        self._unrecorded: list[Any] = []  # incidents seen but not journalled yet (retried)
        self._inflight = 0  # write requests being served (answered before we exit)
        self._inflight_cv = threading.Condition()

    # -- settings the operations see (the same object the CLI builds) ------------------------
    def settings(self) -> Any:
        from tuner.ops.settings import Settings

        return Settings(state_dir=self.cfg.state_dir, backend=self.cfg.backend, sim_root=self.cfg.sim_root)

    @property
    def run_dir(self) -> Path:
        return self.cfg.resolved_run_dir()

    def journal(self) -> Any:
        """One Journal for the daemon's life (it keeps a connection per thread); opening one
        runs the schema script, a write we do not want on every health tick."""
        if self._journal is None:
            from safety import Journal

            self._journal = Journal.in_state_dir(self.cfg.state_dir)
        return self._journal

    def knobs(self) -> dict[str, Any]:
        from tuner.knobs import registry

        return registry.discover(self.host)

    # =========================================================================================
    def run(self) -> int:
        self._environment()
        self._signals()
        try:
            self._lock_daemon()
            self._startup()
            self._serve()
            self.phase = "running"
            self.notifier.ready(self.status_line())
            logs.log("daemon.ready", pid=os.getpid(), status=self.status_line())
            if self.cfg.profile:
                self._start_profile_apply()
            self._loop()
            return 0
        except MetaltuneError as e:
            logs.log("daemon.failed", level="error", error=str(e), exit_code=e.exit_code)
            self.notifier.send({"STATUS": f"failed: {e}", "ERRNO": 1})
            return e.exit_code
        except Exception as e:
            code = getattr(e, "exit_code", 1)
            logs.log("daemon.failed", level="error", error=f"{type(e).__name__}: {e}", exit_code=code)
            self.notifier.send({"STATUS": f"failed: {type(e).__name__}: {e}"})
            return code if isinstance(code, int) else 1
        finally:
            self._shutdown()

    def _environment(self) -> None:
        # operations run in this process must never call back into our own socket, and children
        # (search, benchmarks) see the same host and state as we do
        os.environ[NO_DAEMON_ENV] = "1"
        os.environ["METALTUNE_STATE_DIR"] = str(self.cfg.state_dir)
        os.environ["METALTUNE_BACKEND"] = self.cfg.backend
        if self.cfg.sim_root is not None:
            os.environ["METALTUNE_SIM_ROOT"] = str(self.cfg.sim_root)
        os.environ["METALTUNE_RUN_DIR"] = str(self.run_dir)
        # forked children (safety's watchdog) must not keep our socket or locks open
        os.register_at_fork(after_in_child=self._after_fork_in_child)

    def _after_fork_in_child(self) -> None:
        for fd in (self._daemon_lock_fd,):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        srv = self.server
        if srv is not None and getattr(srv, "_sock", None) is not None:
            try:
                srv._sock.close()
            except OSError:
                pass
        m = self.metrics
        if m is not None and getattr(m, "_server", None) is not None:
            try:
                m._server.socket.close()
            except OSError:
                pass

    def _signals(self) -> None:
        def stop(*_: Any) -> None:
            self.stop_event.set()
            self.wake.set()

        def hup(*_: Any) -> None:
            self.reload_flag.set()
            self.wake.set()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGHUP, hup)

    def _lock_daemon(self) -> None:
        """One daemon per run dir (flock, released by the kernel when we die), then the host's
        writer lock for our whole life."""
        from safety.securefs import UnsafePath, open_file, secure_dir

        try:  # never through a symlink or a directory another user can write
            secure_dir(self.run_dir)
            fd = open_file(self.run_dir / "daemon.lock", os.O_RDWR | os.O_CREAT)
            secure_dir(self.cfg.state_dir)
        except UnsafePath as e:
            raise OperationFailed(str(e)) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise OperationFailed(f"another metaltune daemon is running ({self.run_dir}/daemon.lock)") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._daemon_lock_fd = fd
        self._acquire_writer(timeout=60.0)

    def _acquire_writer(self, timeout: float) -> None:
        from safety import Busy, WriterLock

        from safety.securefs import UnsafePath

        try:
            self._wlock = WriterLock(self.cfg.state_dir, role="daemon").acquire(timeout=timeout)
        except (Busy, UnsafePath) as e:
            raise OperationFailed(str(e)) from None

    def _release_writer(self) -> None:
        if self._wlock is not None:
            self._wlock.release()
            self._wlock = None

    # -- start ------------------------------------------------------------------------------
    def _startup(self) -> None:
        cfg = self.cfg
        logs.log("daemon.start", pid=os.getpid(), config=str(self.cfg_path), backend=cfg.backend,
                 sim_root=cfg.sim_root, state_dir=cfg.state_dir, profile=cfg.profile,
                 stop_policy=cfg.stop_policy, health_interval_s=cfg.health_interval_s)
        self._status("recovering")
        self.mirror.tail(report=False)  # history before this start is not news
        self._call("recover")
        self.mirror.tail()  # what recovery rolled back, logged with its reason
        from safety.incident import REASON_BY_TYPE

        for r in self.journal().pending_rollbacks():  # queued before a crash or a stop
            where = f" gpu {r['gpu']}" if r["gpu"] is not None else ""
            self._pending_rollbacks[r["id"]] = {
                "txn": r["txn_id"], "reason": f"{REASON_BY_TYPE.get(r['type'], 'instability_' + r['type'])}: "
                                              f"{r['severity']} {r['type']}{where}: {r['detail']}"}
        self._status("detecting hardware")
        self.host = self.settings().host()
        self.gpus = health.sample(self.host)
        knobs = self.knobs()
        logs.log("hardware", gpus=len(self.gpus),
                 models=sorted({g.get("name", "?") for g in self.gpus}),
                 knobs=len(knobs), backend=cfg.backend)
        self._ping()
        if cfg.profile:
            # a profile that does not exist or does not parse is a configuration error: exit 2
            self._call("profile_show", profile=cfg.profile)
        self.monitors = self._build_monitors()
        for m in self.monitors:
            m.arm()
        if cfg.metrics.enabled:
            from tuner.daemon.metrics import Metrics

            self.metrics = Metrics(cfg.state_dir, read_knobs=self._knob_values,
                                   read_health=lambda: health.sample(self.host))
        self._refresh_knob_metrics()

    def _start_profile_apply(self) -> None:
        """Re-apply the active profile in a thread: its probation can last minutes, and the
        daemon serves status (and pings the watchdog) meanwhile; writes wait for it."""
        def work() -> None:
            with self.writer:
                self._apply_active_profile()
                self.mirror.tail()
                self._refresh_knob_metrics()
                self._status(None)

        self.profile_state.update(applied="in progress", verified=None)
        self._profile_thread = threading.Thread(target=work, name="profile-apply", daemon=True)
        self._profile_thread.start()

    def _apply_active_profile(self) -> None:
        """NVML settings do not survive a driver reload or reboot: put the profile back, then
        verify. Verified already (a daemon restart): nothing is written."""
        name = self.cfg.profile
        if not name:
            return
        try:
            v = self._call("verify", profile=name)
            if _verified(v):
                self.profile_state.update(applied="already", verified=True)
                logs.log("profile.verified", profile=name, result="ok", note="already in force")
                return
            logs.log("profile.applying", profile=name, reason="active profile not in force",
                     drifted=[k.get("knob") for k in v.get("knobs", []) if k.get("status") == "drifted"])
            res = self._call("apply", profile=name, probation_s=self.cfg.probation_s,
                             policy=_str(self.cfg.policy))
            logs.log("profile.applied", profile=name, reason="re-applied at start", **_summary(res))
            v = self._call("verify", profile=name)
            ok = _verified(v)
            self.profile_state.update(applied=time.time(), verified=ok)
            logs.log("profile.verified", level="info" if ok else "error", profile=name,
                     result="ok" if ok else "mismatch", **_summary(v))
        except Exception as e:  # the host stays as recovered; the daemon keeps serving
            self.profile_state.update(verified=False, error=f"{e}")
            logs.log("profile.failed", level="error", profile=name, error=str(e),
                     kind=type(e).__name__, bad_input=getattr(e, "exit_code", 1) == 2)

    def _build_monitors(self) -> list[Any]:
        """safety's standard health monitors for this host: NVML Xid events, ECC, PCIe replay,
        clock events, temperature, the kernel log's Xid lines and AER counters."""
        from safety.monitors import standard

        nvml = self.host.nvml if self.host.has_nvml() else None
        ms = standard(nvml=nvml, root=self.host.root if self.host.backend == "sim" else "/")
        logs.log("monitors", names=[getattr(m, "name", type(m).__name__) for m in ms], nvml=nvml is not None)
        return ms

    def _serve(self) -> None:
        from tuner.daemon.server import ControlServer

        self.server = ControlServer(self.run_dir, self.handle, allowed_uids=frozenset({0, os.geteuid()}))
        self.server.start()
        if self.metrics is not None:
            m = self.cfg.metrics
            self.metrics.serve(m.address, m.port)
            logs.log("metrics.listening", address=m.address, port=m.port)
            _warn_if_no_network()

    # -- the loop ---------------------------------------------------------------------------
    def _loop(self) -> None:
        wd = self.notifier.watchdog_interval()
        hi = self.cfg.health_interval_s
        now = time.monotonic()
        next_wd = now + wd if wd else None
        next_health = now + hi
        while True:
            deadline = min(x for x in (next_wd, next_health) if x is not None)
            if self.wake.wait(max(0.0, deadline - time.monotonic())):
                self.wake.clear()
            if self.stop_event.is_set():
                return
            if self.reload_flag.is_set():
                self.reload_flag.clear()
                self._reload()
                hi = self.cfg.health_interval_s
                next_health = min(next_health, time.monotonic() + hi)
            now = time.monotonic()
            if next_wd is not None and now >= next_wd:
                self.notifier.watchdog()
                next_wd = now + (wd or 1.0)
            if now >= next_health:
                self._health_tick()
                self._search_tick()
                next_health = max(next_health + hi, time.monotonic())

    def _ping(self) -> None:
        if self.notifier.watchdog_interval():
            self.notifier.watchdog()

    def _health_tick(self) -> None:
        if self.host is None:
            return
        sc = self.cfg.search
        if sc.enabled and sc.only_when_idle:
            # the idle clock for scheduled searches; metrics read their gauges at scrape time
            self.idle.update(health.sample(self.host, fields=("util_pct",)), sc.idle_utilization_pct)
        for m in self.monitors:
            try:
                new = m.poll()
            except Exception as e:  # a broken monitor is reported (once a minute), never fatal
                key = type(m).__name__
                if time.monotonic() - self._monitor_errors.get(key, -1e9) > 60:
                    self._monitor_errors[key] = time.monotonic()
                    logs.log("monitor.error", level="error", monitor=key, error=f"{type(e).__name__}: {e}")
                continue
            self._unrecorded.extend(new)
        self._record_incidents()
        self.mirror.tail()
        self._reap_search()
        self._retry_rollbacks()
        self._status(None)

    # -- incidents ----------------------------------------------------------------------------
    def _record_incidents(self) -> None:
        """Handle the incidents seen; one the journal cannot take yet (a full state dir) is
        kept and tried again next tick: a monitor reports an event only once."""
        while self._unrecorded:
            inc = self._unrecorded[0]
            try:
                self._on_incident(inc)
            except Exception as e:
                if time.monotonic() - self._monitor_errors.get("journal", -1e9) > 60:
                    self._monitor_errors["journal"] = time.monotonic()
                    logs.log("incident.unrecorded", level="error", incident=str(inc),
                             error=f"{type(e).__name__}: {e}", retry="next health tick")
                return
            self._unrecorded.pop(0)

    def _on_incident(self, inc: Any) -> None:
        """An incident from our own monitors: journal it (once per change it belongs to),
        attribute it to the change in force, and for a fatal one queue the rollback. Logging
        and metrics come from the journal tail."""
        journal = self.journal()
        if inc.id is None:
            target, handled = self._attribute(journal, inc)
            if self._duplicate(journal, inc, target):
                return
            if target is not None:
                inc.txn_id = target["id"]
                inc.knob = inc.knob or ",".join(c["knob"] for c in journal.changes(target["id"]))
            inc.attributed = (target, handled)  # a retry after a failed write goes on from here
            journal.add_incident(inc)
            self.mirror.tail()  # log + count it now, before the rollback lines
        target, handled = inc.attributed
        if not inc.fatal:
            return
        if target is None:
            journal.set_incident_action(inc.id, "nothing to roll back: no change in force")
        elif handled is not None:
            journal.set_incident_action(inc.id, f"rolled back: transaction {handled['id']} "
                                                f"({handled['state']}) by its own monitors")
        elif target["state"] == "confirmed" and self.cfg.on_fatal_incident == "record":
            journal.set_incident_action(inc.id, "recorded only: on_fatal_incident = \"record\"")
        else:
            from safety.journal import ROLLBACK_PENDING

            journal.set_incident_action(inc.id, ROLLBACK_PENDING)
            self._pending_rollbacks[inc.id] = {"reason": f"{inc.reason}: {inc}", "txn": target["id"]}
            if self.search is not None:
                # the search owns the writes: stop it; once its child is gone (and what it left
                # unconfirmed recovered), the queued rollback runs
                self._stop_search(f"{inc.reason}: {inc}")
            self._retry_rollbacks()

    def _attribute(self, journal: Any, inc: Any) -> tuple[Optional[dict[str, Any]], Optional[dict[str, Any]]]:
        """(the change the incident belongs to, that change when its own transaction already
        rolled it back for this event): the open transaction, else one rolled back within
        DEDUP_S, else the latest confirmed one still in force. (None, None): nothing in force."""
        open_ = journal.open_txns()
        if open_:
            return open_[-1], None
        recent = journal.txns(1)
        if recent and recent[0]["state"] in ("rolled_back", "rollback_failed") \
                and recent[0]["updated"] >= inc.time - DEDUP_S:
            return recent[0], recent[0]
        ids = {f["txn"] for f in journal.in_force()}
        return (journal.txn(max(ids)) if ids else None), None

    def _duplicate(self, journal: Any, inc: Any, target: Optional[dict[str, Any]]) -> bool:
        """The same event seen again (another monitor, the transaction's own monitors): same
        kind within DEDUP_S, and no change came into force since it was journalled. A change
        confirmed after it is a different change, and its incident is never hidden."""
        for r in journal.incidents(limit=20):
            if r["type"] != inc.type or r["xid"] != inc.xid or abs(r["time"] - inc.time) > DEDUP_S:
                continue
            if target is None or r["txn_id"] == target["id"] or target["created"] <= r["time"]:
                return True
        return False

    def _retry_rollbacks(self) -> None:
        """Run the queued rollbacks that can run now; the others wait for the next tick (the
        writer busy, a search stopping, an apply still writing). Each ends journalled."""
        for inc_id, item in sorted(self._pending_rollbacks.items()):
            try:
                action = self._rollback_for(item["txn"], inc_id, item["reason"], item)
            except Exception as e:  # retried next tick; said once a minute
                action = None
                if time.monotonic() - item.get("error_at", -1e9) > 60:
                    item["error_at"] = time.monotonic()
                    logs.log("rollback.error", level="error", incident=inc_id, txn=item["txn"],
                             error=f"{type(e).__name__}: {e}", retry="next health tick")
            if action is not None:
                self.journal().set_incident_action(inc_id, action)
                del self._pending_rollbacks[inc_id]
                self.mirror.tail()
                self._refresh_knob_metrics()

    def _rollback_for(self, txn_id: int, inc_id: int, reason: str, item: dict[str, Any]) -> Optional[str]:
        """Roll back for one fatal incident; the action to journal, or None to retry later."""
        from safety.restore import rollback_txn

        journal = self.journal()
        t = journal.txn(txn_id)
        if t is None:
            return f"not rolled back: transaction {txn_id} is not in the journal"
        if self.search is not None:
            return None  # its child holds the writer lock; it is being stopped
        if t["state"] in ("intent", "probation", "rolling_back"):
            if t["state"] == "intent" and _alive(t.get("pid")):
                # still writing: a restore now would run under the write in flight, which
                # would then land after it; its owner (or we, next tick) rolls it back
                return None
            if t.get("candidate_key"):
                journal.quarantine(t["candidate_key"], reason, inc_id, txn_id)
            # the journal's claim decides between us and the transaction's owner (or its
            # watchdog): exactly one restores the knobs
            res = rollback_txn(journal, self.knobs(), txn_id, reason, steal=not _alive(t.get("pid")))
            if res["state"] not in ("rolled_back", "rollback_failed"):
                return None
            return f"rolled back: transaction {txn_id} ({res['state']})"
        if t["state"] in ("rolled_back", "rollback_failed"):
            return f"rolled back: transaction {txn_id} ({t['state']}: {t['reason']})"
        # a confirmed change: back to the baseline, under the writer, without ever blocking
        # the main loop (watchdog pings) behind a long write: retried next tick
        if self.cfg.on_fatal_incident == "record":
            return "recorded only: on_fatal_incident = \"record\""
        if not self.writer.acquire(timeout=0.5):
            if not item.get("deferred"):
                item["deferred"] = True
                logs.log("rollback.deferred", level="warning", incident=inc_id, txn=txn_id,
                         reason="another write in progress", retry="every health tick")
            return None
        try:
            from safety import rollback_to_baseline

            if t.get("candidate_key"):
                journal.quarantine(t["candidate_key"], reason, inc_id, txn_id)
            knobs_of = [c["knob"] for c in journal.changes(txn_id)]
            logs.log("rollback.start", level="warning", txn=txn_id, label=t["label"], knobs=knobs_of,
                     reason=reason, to="baseline", cause="fatal incident with a confirmed change in force")
            res = rollback_to_baseline(journal, self.knobs(), state_dir=self.cfg.state_dir,
                                       label=f"rollback to baseline: {reason}")
            self.profile_state.update(verified=False, rolled_back=reason)
        finally:
            self.writer.release()
        if not res["ok"] or res.get("failed"):
            return "rollback to baseline failed: " + "; ".join(
                f"{f['knob']}: {f['error']}" for f in res.get("failed", [])) + " (see `metaltune status`)"
        return f"rolled back to baseline (transaction {res.get('txn', '-')}; restored " \
               f"{', '.join(res['restored']) or 'nothing: already at baseline'})"

    # -- control socket ---------------------------------------------------------------------
    def handle(self, op: str, args: dict[str, Any], peer: Any) -> dict[str, Any]:
        if op == "daemon":
            return self.info()
        if op in SEARCH_OPS:
            if self.phase != "running":
                raise OperationFailed(f"the daemon is {self.phase}; try again when it runs")
            return self._search_request(op, args)
        if op == "search_stop":
            return {"stopped": self._stop_search("stopped by the operator")}
        try:
            fn = ops.get(op)
        except KeyError:
            raise BadInput(f"unknown operation {op!r}; the daemon serves: "
                           f"{', '.join(sorted(set(ops.names()) | set(DAEMON_OPS) | SEARCH_OPS))}") from None
        if self.cfg.policy is not None and args.get("policy") is None and _takes(fn, "policy"):
            args = {**args, "policy": str(self.cfg.policy)}  # the host's allowed-change list
        if op in READ_OPS:
            res = _call_args(fn, self.settings(), args, op)
            if op == "status" and isinstance(res, dict):
                res = {**res, "daemon": self.info()}
            return res
        if self.phase != "running":
            raise OperationFailed(f"the daemon is {self.phase}; try again when it runs")
        if self.search is not None:
            raise OperationFailed(f"busy: a search is running (pid {self.search.pid}); "
                                  "wait for it, or stop it (operation search_stop)")
        with self._inflight_cv:
            self._inflight += 1
        try:
            return self._write_request(fn, op, args, peer)
        finally:
            with self._inflight_cv:
                self._inflight -= 1
                self._inflight_cv.notify_all()

    def _write_request(self, fn: Any, op: str, args: dict[str, Any], peer: Any) -> dict[str, Any]:
        if not self.writer.acquire(timeout=WRITE_WAIT_S):
            raise OperationFailed("busy: another write is in progress; try again")
        try:
            logs.log("request", op=op, uid=peer.uid, pid=peer.pid, args=_brief(args))
            try:
                res = _call_args(fn, self.settings(), args, op)
            except Exception as e:
                self.mirror.tail()
                logs.log("request.failed", level="warning", op=op, error=f"{type(e).__name__}: {e}")
                if not isinstance(e, MetaltuneError) and hasattr(e, "exit_code"):
                    raise _as_metaltune(e) from None
                raise
            logs.log("request.done", op=op, uid=peer.uid, **_summary(res))
            self.mirror.tail()
            self._refresh_knob_metrics()
            self._status(None)
            return res
        finally:
            self.writer.release()

    def info(self) -> dict[str, Any]:
        s = self.search
        return {
            "pid": os.getpid(), "phase": self.phase, "uptime_s": round(time.time() - self.started, 1),
            "config": str(self.cfg_path), "backend": self.cfg.backend,
            "profile": self.profile_state, "stop_policy": self.cfg.stop_policy,
            "health_interval_s": self.cfg.health_interval_s,
            "gpus": health.sample(self.host) if self.host is not None else [],
            "monitors": [type(m).__name__ for m in self.monitors], "counts": dict(self.mirror.counts),
            "last_incident": self.mirror.last_incident, "last_rollback": self.mirror.last_rollback,
            "search": {**self.search_info, "running": s is not None, "pid": s.pid if s else None},
            "metrics": (f"http://{self.cfg.metrics.address}:{self.cfg.metrics.port}/metrics"
                        if self.metrics is not None else None),
            "watchdog_interval_s": self.notifier.watchdog_interval(),
            # the daemon must stay small: heavy frameworks only ever load in children
            "heavy_modules": sorted(m for m in ("torch", "triton", "optuna") if m in sys.modules),
            "status": self.status_line(),
        }

    def status_line(self) -> str:
        parts = [self.phase]
        if self.cfg.profile:
            v = self.profile_state.get("verified")
            parts.append(f"profile {self.cfg.profile} " + ("verified" if v else "NOT verified" if v is False else "pending"))
        try:
            j = self.journal()
            open_ = j.open_txns()
            if open_:
                parts.append(f"probation txn {open_[-1]['id']}")
        except Exception:
            pass
        if self.search is not None:
            parts.append(f"search running (pid {self.search.pid})")
        parts.append(f"{self.mirror.counts['incidents']} incidents, {self.mirror.counts['rollbacks']} rollbacks")
        if self.mirror.last_rollback:
            parts.append(f"last rollback: {self.mirror.last_rollback.get('code') or 'rolled back'}")
        return "; ".join(parts)

    def _status(self, phase_text: Optional[str]) -> None:
        line = phase_text if phase_text is not None else self.status_line()
        if line != self._last_status:
            self._last_status = line
            self.notifier.status(line)
            self._ping()

    def _knob_values(self) -> dict[str, Any]:
        vals = {}
        if self.host is None:
            return vals
        for name, k in self.knobs().items():
            try:
                vals[name] = k.read()
            except Exception:
                continue
        return vals

    def _refresh_knob_metrics(self) -> None:
        if self.metrics is not None:
            self.metrics.probation.set(1 if "probation" in self.status_line() else 0)

    # -- searches -----------------------------------------------------------------------------
    def _search_request(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        """A search asked for through the socket: checked by its options model (bad input
        starts no child), run now in a child, answered with its result."""
        from tuner.ops.args import validate

        args = validate(op, ops.get(op), args)
        child = self._start_search(op, args, why="operator request", wait_s=WRITE_WAIT_S)
        child.wait()
        return self._finish_search(child)

    def _search_tick(self) -> None:
        if self.search is not None:
            if time.time() - self.search.started > self.cfg.search.timeout_s:
                self._stop_search("search.timeout_s reached")
            return
        due, _ = schedule.search_due(self.cfg.search, self.idle, searches.last_started(self.cfg.state_dir))
        if not due:
            return
        sc = self.cfg.search
        args: dict[str, Any] = {"budget": sc.budget, "proposer": sc.proposer}
        if sc.family:
            args["family"] = sc.family
        if self.cfg.policy:
            args["policy"] = str(self.cfg.policy)
        try:
            self._start_search(f"search_{sc.kind}", args, why="schedule", wait_s=0.0)
        except MetaltuneError as e:
            logs.log("search.skipped", level="warning", reason=str(e))

    def _start_search(self, op: str, args: dict[str, Any], why: str, wait_s: float) -> searches.SearchChild:
        if not self.writer.acquire(timeout=wait_s):
            raise OperationFailed("busy: another write is in progress; try again")
        try:
            if self.search is not None:
                raise OperationFailed(f"a search is already running (pid {self.search.pid})")
            self._release_writer()  # hand the host's writer lock to the child: never two writers
            try:
                child = searches.SearchChild(op, args, why, self.cfg.state_dir)
            except OSError as e:
                self._acquire_writer(timeout=60.0)
                raise OperationFailed(f"cannot start the search: {e}") from None
            self.search = child
            self.search_info = child.info()
            searches.record_started(self.cfg.state_dir, child.started)
            if self.metrics is not None:
                self.metrics.search.set(1)
            logs.log("search.started", pid=child.pid, op=op, why=why, args=_brief(args))
            self._status(None)
            return child
        finally:
            self.writer.release()

    def _reap_search(self) -> None:
        c = self.search
        if c is None or not c.done() or c.why == "operator request":
            return  # a requested search is finished by the thread that waits for it
        self._finish_search(c)

    def _finish_search(self, child: searches.SearchChild) -> dict[str, Any]:
        with self.writer:
            if self.search is not child:
                return self.search_info.get("result", {})
            code = child.wait()
            self.search = None
            if self.metrics is not None:
                self.metrics.search.set(0)
            res = child.result()
            # take the writer lock back (a watchdog finishing the child's rollback may hold it
            # briefly), then undo anything the child left unconfirmed
            self._acquire_writer(timeout=60.0)
            rec = self._call("recover")
            n = len((rec or {}).get("recovered", []) or [])
            self.search_info.update(result=res, exit_code=code, finished=time.time())
            logs.log("search.finished", level="info" if code == 0 else "warning",
                     pid=child.pid, exit_code=code, recovered=n, **_summary(res or {}))
            self.mirror.tail()
            self._refresh_knob_metrics()
            self._status(None)
            if code != 0 and res is not None and res.get("ok") is False:
                e = OperationFailed(res.get("error", "search failed"))
                e.exit_code = int(res.get("exit_code", 1))
                raise e
            return res or {"exit_code": code}

    def _stop_search(self, why: str) -> bool:
        c = self.search
        if c is None:
            return False
        logs.log("search.stop", pid=c.pid, reason=why)
        c.stop()
        self._reap_search()
        return True

    # -- reload / stop --------------------------------------------------------------------------
    def _reload(self) -> None:
        self.notifier.reloading()
        try:
            new = load(self.cfg_path)
            check.references(new, self.cfg_path)
        except BadInput as e:
            logs.log("config.reload_failed", level="error", error=str(e), note="keeping the running config")
            self.notifier.send({"READY": 1, "STATUS": f"reload failed: {e}"})
            return
        fixed = [f for f in ("backend", "sim_root", "state_dir", "run_dir") if getattr(new, f) != getattr(self.cfg, f)]
        if fixed:
            logs.log("config.reload_partial", level="warning", needs_restart=fixed)
            for f in fixed:
                setattr(new, f, getattr(self.cfg, f))
        old_profile = self.cfg.profile
        self.cfg = new
        logs.configure(new.log_level)
        logs.log("config.reloaded", config=str(self.cfg_path), profile=new.profile,
                 health_interval_s=new.health_interval_s, search_enabled=new.search.enabled)
        if new.profile != old_profile:
            self.profile_state = {"profile": new.profile, "applied": None, "verified": None}
            if new.profile:
                self._start_profile_apply()
        self.notifier.send({"READY": 1, "STATUS": self.status_line()})

    def _shutdown(self) -> None:
        if self.phase == "stopped":
            return
        self.phase = "stopping"
        self.notifier.stopping(f"stopping (stop policy {self.cfg.stop_policy})")
        logs.log("daemon.stopping", stop_policy=self.cfg.stop_policy)
        if self.server is not None:
            self.server.stop()
        try:
            if self.search is not None:
                self._stop_search("daemon stopping")
            if self._wlock is not None:
                # an operation still in probation (a client's apply) is not waited for: what is
                # unconfirmed is rolled back now (the journal decides who restores each change)
                got = self.writer.acquire(timeout=5.0)
                try:
                    if self.cfg.stop_policy == "rollback":
                        logs.log("rollback.start", level="warning", to="baseline", reason="stop policy rollback")
                        self._call("rollback")
                    else:
                        # keep what is confirmed; what is still in probation is not tuned state
                        self._call("recover")
                    self.mirror.tail()
                finally:
                    if got:
                        self.writer.release()
                # a request whose change was just rolled back gets its answer before we exit
                with self._inflight_cv:
                    self._inflight_cv.wait_for(lambda: self._inflight == 0, timeout=10.0)
                if self.server is not None:
                    self.server.drain(timeout=5.0)
        except Exception as e:
            logs.log("daemon.stop_error", level="error", error=f"{type(e).__name__}: {e}")
        finally:
            if self.metrics is not None:
                self.metrics.close()
            for m in self.monitors:
                close = getattr(m, "close", None)
                if close:
                    try:
                        close()
                    except Exception:
                        pass
            if self.host is not None:
                self.host.close()
            if self._journal is not None:
                self._journal.close()
            self._release_writer()
            if self._daemon_lock_fd is not None:
                os.close(self._daemon_lock_fd)
                self._daemon_lock_fd = None
            self.phase = "stopped"
            logs.log("daemon.stopped")
            self.notifier.close()

    # -- helpers --------------------------------------------------------------------------------
    def _call(self, op: str, **kw: Any) -> dict[str, Any]:
        """Run a registered operation in this process (we are the single writer)."""
        try:
            fn = ops.get(op)
        except KeyError:
            raise OperationFailed(f"operation {op!r} is not available in this build") from None
        try:
            return _call_kw(fn, self.settings(), **kw) or {}
        except MetaltuneError:
            raise
        except Exception as e:
            if hasattr(e, "exit_code"):
                raise _as_metaltune(e) from None
            raise


# =============================================================================================
def run(cfg: DaemonConfig, cfg_path: Path) -> int:
    logs.configure(cfg.log_level)
    return Daemon(cfg, cfg_path).run()


def _call_kw(fn: Any, *args: Any, **kw: Any) -> Any:
    """Call fn with the keyword arguments it accepts (operations differ in their options)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return fn(*args, **kw)
    if any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        return fn(*args, **{k: v for k, v in kw.items() if v is not None})
    return fn(*args, **{k: v for k, v in kw.items() if k in sig.parameters and v is not None})


def _takes(fn: Any, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _call_args(fn: Any, settings: Any, args: dict[str, Any], op: str = "request") -> Any:
    """A client's arguments are checked by the operation's model (the one the CLI's local path
    uses): an unknown one or a wrong type is that client's bad input."""
    from tuner.ops.args import validate

    return fn(settings, **validate(op, fn, args))


def _as_metaltune(e: BaseException) -> MetaltuneError:
    code = getattr(e, "exit_code", 1)
    err: MetaltuneError = BadInput(str(e)) if code == 2 else OperationFailed(str(e))
    return err


def _verified(v: Any) -> bool:
    if not isinstance(v, dict):
        return False
    for k in ("ok", "verified", "match", "matches"):
        if k in v:
            return bool(v[k])
    return False


def _summary(res: Any) -> dict[str, Any]:
    """The greppable essentials of an operation's result (no big blobs in the log)."""
    if not isinstance(res, dict):
        return {}
    out: dict[str, Any] = {}
    for k in ("ok", "txn", "transaction", "state", "reason", "result", "applied", "changes", "restored",
              "confirmed", "run_id", "best", "gain", "trials", "mismatches", "error"):
        v = res.get(k)
        if v is None:
            continue
        if isinstance(v, list) and len(v) > 20:
            v = f"{len(v)} items"
        elif isinstance(v, dict) and len(json.dumps(v, default=str)) > 400:
            v = f"{len(v)} entries"
        out[k if k not in ("state",) else "result_state"] = v
    if "recovered" in res and isinstance(res["recovered"], list):
        out["recovered"] = len(res["recovered"])
    return out


def _brief(args: dict[str, Any]) -> dict[str, Any]:
    return {k: (v if len(json.dumps(v, default=str)) < 200 else "...") for k, v in args.items()}


def _alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _str(p: Any) -> Optional[str]:
    return None if p is None else str(p)


def _warn_if_no_network() -> None:
    import socket

    try:
        names = [n for _, n in socket.if_nameindex()]
    except OSError:
        return
    if names == ["lo"] and os.environ.get("INVOCATION_ID"):
        logs.log("metrics.unreachable", level="warning",
                 reason="the service runs with PrivateNetwork=yes; run `metaltune install` again "
                        "so the unit allows loopback network for metrics")
