"""Opt-in Prometheus endpoint (prometheus-client): no listener unless `[metrics] enabled`, bound
to `[metrics] address` (default 127.0.0.1). Names follow Prometheus' conventions (base units in the
name: `_celsius`, `_watts`, `_hertz`, `_ratio`; counters end in `_total`) and carry dcgm-exporter's
`gpu` and `UUID` labels, so a dashboard can join them with DCGM_FI_* series.

| metric | labels | what (dcgm-exporter analogue) |
| --- | --- | --- |
| metaltune_knob_value | knob, gpu | applied numeric knob values, in the knob's own unit (the name says it: `_w`, `_mhz`); a clock pair exports .min/.max |
| metaltune_knob_info | knob, gpu, value | non-numeric knob values (governor, THP), always 1 |
| metaltune_incidents_total | type, xid | incidents seen by the health monitors |
| metaltune_rollbacks_total | reason | rollbacks done by the daemon |
| metaltune_trials_total | verdict | trials in the store (read at scrape time) |
| metaltune_gain_ratio | | holistic objective of the incumbent / run baseline (1.0 = no gain) |
| metaltune_gpu_temperature_celsius | gpu, UUID | DCGM_FI_DEV_GPU_TEMP |
| metaltune_gpu_power_usage_watts | gpu, UUID | DCGM_FI_DEV_POWER_USAGE |
| metaltune_gpu_sm_clock_hertz | gpu, UUID | DCGM_FI_DEV_SM_CLOCK (which is in MHz) |
| metaltune_gpu_memory_clock_hertz | gpu, UUID | DCGM_FI_DEV_MEM_CLOCK (MHz) |
| metaltune_gpu_utilization_ratio | gpu, UUID | DCGM_FI_DEV_GPU_UTIL (which is in %) |
| metaltune_gpu_last_xid | gpu | DCGM_FI_DEV_XID_ERRORS: value of the last Xid |
| metaltune_probation_active, metaltune_search_running | | 0/1 |
"""
from __future__ import annotations

import logging
import re
import selectors
import socket
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterable, Optional
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

_GPU = re.compile(r"^gpu(\d+)\.")
_HEALTH = {  # sample key -> metric name, help, factor from the sample's unit to the base unit
    "temp_c": ("metaltune_gpu_temperature_celsius", "GPU temperature (DCGM_FI_DEV_GPU_TEMP).", 1.0),
    "power_w": ("metaltune_gpu_power_usage_watts", "Power draw (DCGM_FI_DEV_POWER_USAGE).", 1.0),
    "sm_clock_mhz": ("metaltune_gpu_sm_clock_hertz", "SM clock (DCGM_FI_DEV_SM_CLOCK, in MHz there).", 1e6),
    "mem_clock_mhz": ("metaltune_gpu_memory_clock_hertz", "Memory clock (DCGM_FI_DEV_MEM_CLOCK, in MHz there).",
                      1e6),
    "util_pct": ("metaltune_gpu_utilization_ratio", "GPU utilisation, 0-1 (DCGM_FI_DEV_GPU_UTIL, in % there).",
                 0.01),
}


class _StoreCollector(Collector):
    """Trials by verdict and the current gain, read from the trial store at scrape time (the
    searches that write it run in child processes)."""

    def __init__(self, db_path: Path):
        self.db_path = db_path

    def collect(self) -> Iterable[Any]:
        trials = CounterMetricFamily("metaltune_trials", "Trials evaluated, by verdict.", labels=["verdict"])
        gain = GaugeMetricFamily("metaltune_gain_ratio",
                                 "Incumbent holistic objective / the run's baseline (1.0 = no gain).")
        counts, ratio = store_summary(self.db_path)
        for v in ("kept", "reverted", "rejected", "rolled_back"):
            trials.add_metric([v], counts.get(v, 0))
        for v, n in counts.items():
            if v not in ("kept", "reverted", "rejected", "rolled_back"):
                trials.add_metric([v], n)
        yield trials
        if ratio is not None:
            gain.add_metric([], ratio)
        yield gain


def store_summary(db_path: Path) -> tuple[dict[str, int], float | None]:
    """(trials per verdict, gain ratio of the latest run with a kept trial), read-only."""
    if not db_path.exists():
        return {}, None
    try:
        db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=2.0)
    except sqlite3.Error:
        return {}, None
    try:
        counts = dict(db.execute("SELECT verdict, count(*) FROM trials GROUP BY verdict").fetchall())
        row = db.execute(
            "SELECT run_id FROM trials WHERE verdict='kept' AND objective IS NOT NULL ORDER BY id DESC LIMIT 1"
        ).fetchone()
        ratio = None
        if row:
            objs = db.execute(
                "SELECT reason, objective FROM trials WHERE run_id=? AND verdict='kept' AND objective IS NOT NULL"
                " ORDER BY id", (row[0],)).fetchall()
            base = next((o for r, o in objs if r == "baseline"), objs[0][1])
            if base:
                ratio = objs[-1][1] / base
        return counts, ratio
    except sqlite3.Error:
        return {}, None
    finally:
        db.close()


class _LiveCollector(Collector):
    """Knob values and health readings read when Prometheus scrapes, not on every health tick:
    an idle daemon pays nothing for them, and a value changed behind metaltune's back shows."""

    def __init__(self, read_knobs: Optional[Callable[[], dict[str, Any]]],
                 read_health: Optional[Callable[[], list[dict[str, Any]]]]):
        self.read_knobs, self.read_health = read_knobs, read_health

    def collect(self) -> Iterable[Any]:
        kv = GaugeMetricFamily("metaltune_knob_value", "Applied knob value.", labels=["knob", "gpu"])
        ki = GaugeMetricFamily("metaltune_knob_info", "Applied non-numeric knob value (1).",
                               labels=["knob", "gpu", "value"])
        for name, gpu, value, info in knob_samples(self.read_knobs() if self.read_knobs else {}):
            if info is None:
                kv.add_metric([name, gpu], value)
            else:
                ki.add_metric([name, gpu, info], 1)
        yield kv
        yield ki
        gpus = self.read_health() if self.read_health else []
        for key, (metric, help_, factor) in _HEALTH.items():
            fam = GaugeMetricFamily(metric, help_, labels=["gpu", "UUID"])
            for g in gpus:
                if g.get(key) is not None:
                    fam.add_metric([str(g["index"]), str(g.get("uuid", ""))], float(g[key]) * factor)
            yield fam


def knob_samples(values: dict[str, Any]) -> list[tuple[str, str, float, Optional[str]]]:
    """(knob, gpu, value, info): numbers as values, a 2-element clock pair as two series,
    anything else as an info series (value 1); unset (None) knobs are left out."""
    out: list[tuple[str, str, float, Optional[str]]] = []
    for name, v in sorted(values.items()):
        m = _GPU.match(name)
        gpu = m.group(1) if m else ""
        if isinstance(v, bool):
            out.append((name, gpu, float(v), None))
        elif isinstance(v, (int, float)):
            out.append((name, gpu, float(v), None))
        elif isinstance(v, (list, tuple)) and len(v) == 2 and all(isinstance(x, (int, float)) for x in v):
            # application clocks are [graphics, memory]; clock locks are [min, max]
            parts = (".graphics", ".memory") if name.endswith("app_clocks_mhz") else (".min", ".max")
            out += [(name + parts[0], gpu, float(v[0]), None), (name + parts[1], gpu, float(v[1]), None)]
        elif v is not None and not isinstance(v, dict):
            out.append((name, gpu, 1.0, str(v)))
    return out


class Metrics:
    def __init__(self, state_dir: Path, read_knobs: Optional[Callable[[], dict[str, Any]]] = None,
                 read_health: Optional[Callable[[], list[dict[str, Any]]]] = None):
        self.registry = CollectorRegistry()
        r = self.registry
        r.register(_LiveCollector(read_knobs, read_health))
        self.incidents = Counter("metaltune_incidents", "Incidents seen by the health monitors.",
                                 ["type", "xid"], registry=r)
        self.rollbacks = Counter("metaltune_rollbacks", "Rollbacks done by the daemon.", ["reason"], registry=r)
        self.xid = Gauge("metaltune_gpu_last_xid", "Value of the last Xid (DCGM_FI_DEV_XID_ERRORS).",
                         ["gpu"], registry=r)
        self.probation = Gauge("metaltune_probation_active", "1 while a change is in probation.", registry=r)
        self.search = Gauge("metaltune_search_running", "1 while a search child runs.", registry=r)
        r.register(_StoreCollector(Path(state_dir) / "trials.db"))
        self._server: Any = None

    def serve(self, address: str, port: int, **limits: Any) -> None:
        """Listen on address:port with the server's connection limits (idle_s, max_conns,
        workers: MetricsServer)."""
        self._server = MetricsServer(make_wsgi_app(self.registry), address, port, **limits).start()

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    # -- updates from the daemon ---------------------------------------------------------------
    def incident(self, kind: str, xid: Any = None, gpu: Any = None) -> None:
        self.incidents.labels(kind, "" if xid is None else str(xid)).inc()
        if xid is not None and gpu is not None:
            self.xid.labels(str(gpu)).set(float(xid))

    def rollback(self, reason: str) -> None:
        self.rollbacks.labels(reason).inc()


# -- the HTTP server ------------------------------------------------------------------------
# The metrics endpoint's HTTP server: prometheus-client's WSGI app behind wsgiref, with the
# limits a root daemon's listener needs (issue 42, item 9: prometheus-client's own server starts a
# thread per connection and never times one out; 200 idle connections took the daemon from 4 to
# ~175 threads).
#
# - A connection waits in a selector (no thread) until its request arrives; one that sends
#   nothing for `idle_s` is closed.
# - At most `max_conns` connections are open at once; one more makes the longest silent one
#   close (so a scraper gets in however many idle ones there are), or is closed at accept when
#   every slot is a request being answered.
# - Requests are answered by a pool of `workers` threads; each read and write of a request has
#   the same `idle_s` timeout, so a slow client holds one worker for a bounded time.
#
# So the endpoint costs at most 1 + `workers` threads and `max_conns` descriptors, however many
# clients connect.
log = logging.getLogger(__name__)

IDLE_S = 10.0
MAX_CONNS = 32
WORKERS = 2


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  # no access log
        pass


class _Server(WSGIServer):
    """wsgiref's server for its request handling only: our loop accepts and dispatches."""

    def __init__(self, addr: tuple[str, int], family: int):
        self.address_family = family
        super().__init__(addr, _Quiet)


class MetricsServer:
    def __init__(self, app: Callable[..., Any], address: str, port: int, *,
                 idle_s: float = IDLE_S, max_conns: int = MAX_CONNS, workers: int = WORKERS):
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self._srv = _Server((address, port), family)
        self._srv.set_app(app)
        self._srv.socket.setblocking(False)
        self.idle_s, self.max_conns = idle_s, max_conns
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="metrics")
        self._sel = selectors.DefaultSelector()
        self._waiting: dict[socket.socket, float] = {}  # connection -> when it is closed idle
        self._busy = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.refused = self.closed_idle = 0
        self._thread = threading.Thread(target=self._loop, name="metrics-accept", daemon=True)

    @property
    def port(self) -> int:
        return self._srv.server_port

    def start(self) -> "MetricsServer":
        self._sel.register(self._srv.socket, selectors.EVENT_READ, None)
        self._thread.start()
        return self

    def open_connections(self) -> int:
        with self._lock:
            return len(self._waiting) + self._busy

    def _loop(self) -> None:
        while not self._stop.is_set():
            for key, _ in self._sel.select(timeout=0.2):
                if key.data is None:
                    self._accept()
                else:
                    self._dispatch(key.fileobj, key.data)  # type: ignore[arg-type]
            now = time.monotonic()
            for conn, deadline in list(self._waiting.items()):
                if deadline <= now:
                    self._drop(conn)
                    self.closed_idle += 1

    def _accept(self) -> None:
        try:
            conn, addr = self._srv.socket.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:  # EMFILE and the like: say it, keep serving the open ones
            log.warning("metrics endpoint: accept failed: %s", e)
            time.sleep(0.1)
            return
        if self.open_connections() >= self.max_conns:
            with self._lock:
                oldest = min(self._waiting, key=self._waiting.__getitem__, default=None)
            if oldest is None:  # every slot is a request being answered
                self.refused += 1
                conn.close()
                return
            self._drop(oldest)  # the longest silent one makes room: a scraper always gets in
            self.closed_idle += 1
        conn.setblocking(False)
        with self._lock:
            self._waiting[conn] = time.monotonic() + self.idle_s
        self._sel.register(conn, selectors.EVENT_READ, addr)

    def _drop(self, conn: socket.socket) -> None:
        self._sel.unregister(conn)
        with self._lock:
            self._waiting.pop(conn, None)
        conn.close()

    def _dispatch(self, conn: socket.socket, addr: Any) -> None:
        self._sel.unregister(conn)
        with self._lock:
            self._waiting.pop(conn, None)
            self._busy += 1
        conn.setblocking(True)
        conn.settimeout(self.idle_s)
        self._pool.submit(self._answer, conn, addr)

    def _answer(self, conn: socket.socket, addr: Any) -> None:
        try:
            self._srv.finish_request(conn, addr)
        except (OSError, ValueError):
            pass  # a client that went away or timed out: nothing to answer
        except Exception:  # noqa: BLE001  # one bad request never stops the endpoint
            log.exception("metrics endpoint: request failed")
        finally:
            self._srv.shutdown_request(conn)
            with self._lock:
                self._busy -= 1

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(2)
        for conn in list(self._waiting):
            self._drop(conn)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._sel.close()
        self._srv.server_close()
