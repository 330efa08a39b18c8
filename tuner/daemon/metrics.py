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

import re
import sqlite3
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

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
        workers: tuner.daemon.metrics_server)."""
        from tuner.daemon.metrics_server import MetricsServer

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
