"""End to end, as an operator does it: install into a folder, start the daemon from the installed
config, apply a profile with the CLI, an Xid 79 hits the (simulated) GPU, and the rollback shows
in `metaltune status`, in the Prometheus metrics and in the log."""
from __future__ import annotations

import json
import os
import re
import urllib.request

import pytest

from tests.daemon.conftest import base_env, free_port, metaltune, power_limit_w, write_profile

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the daemon's socket is root-only")


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def metric(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def set_key(text: str, section: str, key: str, value: str) -> str:
    """Set `key = value` in a TOML section of the installed (commented) template."""
    out, cur, done = [], "", False
    for line in text.splitlines():
        if line.startswith("["):
            if cur == section and not done:
                out.append(f"{key} = {value}")
                done = True
            cur = line.split("]")[0].strip("[")
        if cur == section and re.match(rf"#?\s*{re.escape(key)}\s*=", line):
            line, done = f"{key} = {value}", True
        out.append(line)
    if not done:
        out.append(f"{key} = {value}")
    return "\n".join(out) + "\n"


def test_install_start_apply_xid_rollback(tmp_path, sim_host, start_daemon):
    root = tmp_path / "root"
    env = base_env(tmp_path / "run")
    metaltune("install", "--root", str(root), "--backend", "sim", "--sim-root", str(sim_host), env=env)
    cfg = root / "etc/metaltune/config.toml"
    port = free_port()
    # point the installed config's absolute paths into the folder, as a package's postinst would
    text = cfg.read_text()
    for section, key, value in [
        ("", "state_dir", f'"{root}/var/lib/metaltune"'), ("", "policy", f'"{root}/etc/metaltune/policy.yaml"'),
        ("", "run_dir", f'"{tmp_path / "run"}"'), ("", "health_interval_s", "0.2"), ("", "probation_s", "1"),
        ("metrics", "enabled", "true"), ("metrics", "port", str(port)),
    ]:
        text = set_key(text, section, key, value)
    cfg.write_text(text)
    assert metaltune("daemon", "--check", "--config", str(cfg), env=env).returncode == 0

    d = start_daemon(cfg)
    d.wait_ready()
    before = scrape(port)
    assert metric(before, "metaltune_knob_value", knob="gpu0.power_limit_w", gpu="0") == 700
    assert metric(before, "metaltune_gpu_temperature_celsius", gpu="0") is not None  # health gauges, DCGM style

    prof = write_profile(tmp_path / "tuned.yaml", 600)
    r = d.cli("apply", str(prof), "--probation", "0.5")
    assert power_limit_w(sim_host) == 600
    d.wait_log("event=change.confirmed")
    assert metric(scrape(port), "metaltune_knob_value", knob="gpu0.power_limit_w", gpu="0") == 600

    # the GPU falls off the bus
    metaltune("sim", "inject", str(sim_host), "xid", "79", env=env)
    log = d.wait_log("event=rollback ")
    assert power_limit_w(sim_host) == 700

    # ... in the log: the incident and the rollback, with the reason, greppable
    inc = [l for l in log.splitlines() if "event=incident" in l]
    assert inc and "xid=79" in inc[0] and "severity=fatal" in inc[0]
    rb = [l for l in log.splitlines() if "event=rollback " in l]
    assert any("knob=gpu0.power_limit_w" in l and "to=600" not in l and "instability_xid" in l for l in rb), rb

    # ... in status (through the CLI and the socket)
    st = json.loads(d.cli("status", "--json").stdout)
    assert st["current"]["gpu0.power_limit_w"] == 700
    assert st["daemon"]["last_rollback"]["reason"].startswith("instability_xid")
    assert st["daemon"]["counts"]["rollbacks"] >= 1
    assert any(i["xid"] == 79 for i in st["incidents"])
    assert d.notify.wait(lambda m: "last rollback: instability_xid" in m.get("STATUS", ""))

    # ... and in the metrics
    m = scrape(port)
    assert metric(m, "metaltune_incidents_total", type="xid", xid="79") == 1
    assert metric(m, "metaltune_rollbacks_total", reason="instability_xid") == 1
    assert metric(m, "metaltune_knob_value", knob="gpu0.power_limit_w", gpu="0") == 700
    assert metric(m, "metaltune_gpu_last_xid", gpu="0") == 79
    # the changed candidate is quarantined: applying it again is refused
    again = d.call("apply", profile=str(prof), probation_s=0.5)
    assert again["ok"] is False and "quarantined" in again["error"]
    assert d.stop() == 0
