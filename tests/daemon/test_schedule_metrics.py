"""When a scheduled search may start, and the metrics registry's names and values."""
from __future__ import annotations

import datetime as dt
import sqlite3

from prometheus_client import generate_latest

from tuner.daemon.config import SearchConfig
from tuner.daemon.metrics import Metrics
from tuner.daemon.schedule import IdleTracker, in_window, search_due


def at(h: int, m: int = 0) -> dt.datetime:
    return dt.datetime(2026, 11, 29, h, m)


def test_windows_including_midnight_wrap():
    assert in_window([], at(12))
    assert in_window(["02:00-05:00"], at(2)) and in_window(["02:00-05:00"], at(4, 59))
    assert not in_window(["02:00-05:00"], at(5)) and not in_window(["02:00-05:00"], at(1, 59))
    assert in_window(["23:30-01:00"], at(23, 45)) and in_window(["23:30-01:00"], at(0, 30))
    assert not in_window(["23:30-01:00"], at(12))


def test_idle_tracker_needs_every_gpu_idle():
    t = IdleTracker()
    t.update([{"index": 0, "util_pct": 0}, {"index": 1, "util_pct": 3}], 5, now=100.0)
    assert t.idle_for(now=160.0) == 60.0
    t.update([{"index": 0, "util_pct": 0}, {"index": 1, "util_pct": 80}], 5, now=170.0)
    assert t.idle_for(now=200.0) == 0.0
    t.update([{"index": 0}], 5, now=210.0)  # no utilisation reading: never counts as idle
    assert t.idle_for(now=300.0) == 0.0


def test_search_due_gates():
    idle = IdleTracker()
    idle.update([{"index": 0, "util_pct": 0}], 5, now=0.0)
    cfg = SearchConfig(enabled=True, windows=["02:00-05:00"], idle_for_s=0, min_interval_s=3600)
    assert search_due(SearchConfig(), idle, None, 1e9, at(3)) == (False, "search disabled in config")
    assert search_due(cfg, idle, None, 1e9, at(3))[0]
    assert search_due(cfg, idle, None, 1e9, at(12))[1] == "outside the maintenance window"
    assert "recently" in search_due(cfg, idle, 1e9 - 60, 1e9, at(3))[1]
    busy = IdleTracker()
    busy.update([{"index": 0, "util_pct": 90}], 5)
    assert search_due(cfg.model_copy(update={"idle_for_s": 300}), busy, None, 1e9, at(3))[1] == \
        "GPUs not idle long enough"


def test_metrics_names_and_values(tmp_path):
    db = sqlite3.connect(tmp_path / "trials.db")
    db.executescript("CREATE TABLE trials (id INTEGER PRIMARY KEY, run_id TEXT, number INT, verdict TEXT,"
                     " reason TEXT, objective REAL, started_at REAL, body TEXT);")
    rows = [("r1", "kept", "baseline", 100.0), ("r1", "reverted", "worse", 90.0),
            ("r1", "kept", "improved", 108.0), ("r1", "rejected", "policy_denied", None)]
    db.executemany("INSERT INTO trials(run_id, verdict, reason, objective) VALUES (?,?,?,?)", rows)
    db.commit()
    db.close()
    knobs = {"gpu0.power_limit_w": 600, "gpu1.locked_clocks_mhz": [1410, 1410],
             "gpu0.app_clocks_mhz": [1980, 3201], "cpu.governor": "performance",
             "gpu0.persistence_mode": True, "gpu2.x": None}
    reads = []
    m = Metrics(tmp_path, read_knobs=lambda: reads.append(1) or knobs,
                read_health=lambda: [{"index": 0, "uuid": "GPU-abc", "temp_c": 41.0, "power_w": 123.5,
                                      "sm_clock_mhz": 1980, "mem_clock_mhz": 3201, "util_pct": 37}])
    assert reads == []  # nothing is read until Prometheus scrapes
    m.incident("xid", 79, "0")
    m.rollback("instability_xid")
    text = generate_latest(m.registry).decode()
    assert 'metaltune_knob_value{gpu="0",knob="gpu0.power_limit_w"} 600.0' in text
    assert 'metaltune_knob_value{gpu="1",knob="gpu1.locked_clocks_mhz.max"} 1410.0' in text
    assert 'metaltune_knob_value{gpu="0",knob="gpu0.app_clocks_mhz.memory"} 3201.0' in text
    assert reads == [1]
    assert 'metaltune_knob_info{gpu="",knob="cpu.governor",value="performance"} 1.0' in text
    # Prometheus base units in the names, dcgm-exporter's labels
    assert 'metaltune_gpu_temperature_celsius{UUID="GPU-abc",gpu="0"} 41.0' in text
    assert 'metaltune_gpu_power_usage_watts{UUID="GPU-abc",gpu="0"} 123.5' in text
    assert 'metaltune_gpu_sm_clock_hertz{UUID="GPU-abc",gpu="0"} 1.98e+09' in text
    assert 'metaltune_gpu_memory_clock_hertz{UUID="GPU-abc",gpu="0"} 3.201e+09' in text
    assert 'metaltune_gpu_utilization_ratio{UUID="GPU-abc",gpu="0"} 0.37' in text
    assert 'metaltune_incidents_total{type="xid",xid="79"} 1.0' in text
    assert 'metaltune_gpu_last_xid{gpu="0"} 79.0' in text
    assert 'metaltune_rollbacks_total{reason="instability_xid"} 1.0' in text
    assert 'metaltune_trials_total{verdict="kept"} 2.0' in text
    assert 'metaltune_trials_total{verdict="rejected"} 1.0' in text
    assert "metaltune_gain_ratio 1.08" in text
    assert "gpu2.x" not in text
