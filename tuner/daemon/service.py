"""The daemon's life: start (recover, detect, re-apply + verify the active profile), serve the
control socket, watch health, attribute incidents and roll back, run scheduled searches in a child
process, reload on SIGHUP, stop per the stop policy on SIGTERM.

The pieces are objects of their own, given what they need: the journal (JournalRef, reopened
when its file is replaced), the incident queue (IncidentQueue), the search child
(SearchRunner), the control socket's routing (Router). This module is the life around them.

Threads: the main thread runs the loop (watchdog pings, health ticks, the search scheduler);
each control client has a thread. `self.writer` serialises every write in this process (socket
operations, incident rollbacks, starting a search); safety's WriterLock (held for the daemon's
life, handed to a search child while it runs) keeps other processes out.
"""
from __future__ import annotations

import inspect
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

from tuner import ops
from tuner.daemon import check, health, logs, schedule
from tuner.daemon.active_profile import ActiveProfile
from tuner.ops.settings import NO_DAEMON_ENV
from tuner.daemon.config import DaemonConfig, load
from tuner.daemon.incidents import IncidentQueue
from tuner.daemon.journal_ref import JournalRef
from tuner.daemon.locks import DaemonLocks
from tuner.daemon.mirror import JournalMirror
from tuner.daemon.notify import Notifier
from tuner.daemon.routing import Router, as_metaltune
from tuner.daemon.searches import SearchRunner
from tuner.errors import BadInput, MetaltuneError, OperationFailed


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
        #: the daemon's one journal, reopened when a reset replaces its file
        self.journal = JournalRef(cfg.state_dir)
        self.mirror = JournalMirror(self.journal, lambda: self.metrics)
        self.locks = DaemonLocks(self.run_dir, cfg.state_dir)
        self.searches = SearchRunner(self.writer, lambda: self.cfg, self.locks.give_writer,
                                     self.locks.take_writer, lambda: self._call("recover"),
                                     self.idle, lambda: self.metrics, self._changed)
        self.incidents = IncidentQueue(self.journal, self.knobs, self.writer, lambda: self.cfg,
                                       self.searches, self._changed, self._baseline_restored,
                                       lambda: self._call("recover", from_defaults=True))
        self.router = Router(self.settings, lambda: self.cfg, lambda: self.phase, self.info,
                             self.searches, self.writer, self._changed)
        self._last_status = ""
        self._monitor_errors: dict[str, float] = {}
        self.profile = ActiveProfile(cfg.profile, self._call, self.writer, lambda: self.cfg,
                                     self._changed)

    # -- settings the operations see (the same object the CLI builds) ------------------------
    def settings(self) -> Any:
        from tuner.ops.settings import Settings

        return Settings(state_dir=self.cfg.state_dir, backend=self.cfg.backend, sim_root=self.cfg.sim_root)

    @property
    def run_dir(self) -> Path:
        return self.cfg.resolved_run_dir()

    def _changed(self) -> None:
        """The journal moved on: log and count what is new, refresh the metrics and status."""
        self.mirror.tail()
        self._refresh_knob_metrics()
        self._status(None)

    def _baseline_restored(self, reason: str) -> None:
        self.profile.rolled_back(reason)

    def knobs(self) -> dict[str, Any]:
        from tuner.knobs import registry

        return registry.discover(self.host, state_dir=self.cfg.state_dir)

    # =========================================================================================
    def run(self) -> int:
        self._environment()
        self._signals()
        try:
            self.locks.lock_daemon()
            self._startup()
            self._serve()
            self.phase = "running"
            self.notifier.ready(self.status_line())
            logs.log("daemon.ready", pid=os.getpid(), status=self.status_line())
            if self.cfg.profile:
                self.profile.start()
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
        for fd in (self.locks.fd,):
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
        self.incidents.load_pending()  # queued before a crash or a stop
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

    def _build_monitors(self) -> list[Any]:
        """safety's standard health monitors for this host: NVML Xid events, ECC, PCIe replay,
        clock events, temperature, the kernel log's Xid lines and AER counters, and the kernel
        canary's incident log."""
        from tuner.search.safety_context import host_monitors

        # the kernel canary's incidents from model processes (STATE_DIR/kernels/canary.jsonl),
        # read on from the cursor: lines written while the daemon was down are journalled too
        ms = host_monitors(self.host, state_dir=self.cfg.state_dir, cursor=True)
        logs.log("monitors", names=[getattr(m, "name", type(m).__name__) for m in ms],
                 nvml=any(getattr(m, "nvml", None) is not None for m in ms))
        return ms

    def _serve(self) -> None:
        from tuner.daemon.server import ControlServer

        self.server = ControlServer(self.run_dir, self.router.handle, allowed_uids=frozenset({0, os.geteuid()}))
        self.server.start()
        if self.metrics is not None:
            m = self.cfg.metrics
            self.metrics.serve(m.address, m.port, idle_s=m.idle_timeout_s,
                               max_conns=m.max_connections)
            logs.log("metrics.listening", address=m.address, port=m.port,
                     idle_timeout_s=m.idle_timeout_s, max_connections=m.max_connections)
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
                self.searches.tick()
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
            self.incidents.add(new)
        self.incidents.record()
        self.mirror.tail()
        self.searches.reap()
        self.incidents.retry_rollbacks()
        self._status(None)

    def info(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(), "phase": self.phase, "uptime_s": round(time.time() - self.started, 1),
            "config": str(self.cfg_path), "backend": self.cfg.backend,
            "profile": self.profile.state, "stop_policy": self.cfg.stop_policy,
            "health_interval_s": self.cfg.health_interval_s,
            "gpus": health.sample(self.host) if self.host is not None else [],
            "monitors": [type(m).__name__ for m in self.monitors], "counts": dict(self.mirror.counts),
            "last_incident": self.mirror.last_incident, "last_rollback": self.mirror.last_rollback,
            "search": {**self.searches.info, "running": self.searches.running,
                       "pid": self.searches.pid},
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
            v = self.profile.state.get("verified")
            parts.append(f"profile {self.cfg.profile} " + ("verified" if v else "NOT verified" if v is False else "pending"))
        try:
            j = self.journal()
            open_ = j.open_txns()
            if open_:
                parts.append(f"probation txn {open_[-1]['id']}")
        except Exception:
            pass
        if self.searches.running:
            parts.append(f"search running (pid {self.searches.pid})")
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
            self.profile.renamed(new.profile)
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
            self.searches.stop("daemon stopping")
            if self.locks.writing:
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
                self.router.wait_idle(timeout=10.0)
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
            self.journal.close()
            self.locks.close()
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
                raise as_metaltune(e) from None
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
