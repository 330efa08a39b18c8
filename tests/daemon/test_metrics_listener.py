"""The daemon's Prometheus endpoint, scraped for real over HTTP: no listener unless configured, bound
to the configured address (here 127.0.0.2, which the default 127.0.0.1 is not), names with their
units as Prometheus names them and values converted to those units."""
from __future__ import annotations

import os
import urllib.error
import urllib.request

import psutil
import pytest

from tests.daemon.conftest import free_port, write_config

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the daemon's socket is root-only")


def scrape(addr: str, port: int) -> str:
    with urllib.request.urlopen(f"http://{addr}:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def samples(text: str, name: str) -> list[float]:
    return [float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l.startswith(name + "{")]


def inet_listeners(pid: int) -> list:
    return [c for c in psutil.Process(pid).net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]


def test_no_listener_unless_configured(tmp_path, sim_host, start_daemon):
    d = start_daemon(write_config(tmp_path / "c.toml", sim_host, tmp_path))
    d.wait_ready()
    assert inet_listeners(d.pid) == []
    assert d.cli("status", "--json").returncode == 0


def test_scrape_on_the_configured_address_with_units_in_the_names(tmp_path, sim_host, start_daemon):
    port = free_port()
    cfg = write_config(tmp_path / "c.toml", sim_host, tmp_path)
    cfg.write_text(cfg.read_text() + f'[metrics]\nenabled = true\naddress = "127.0.0.2"\nport = {port}\n')
    d = start_daemon(cfg)
    d.wait_ready()
    assert [(c.laddr.ip, c.laddr.port) for c in inet_listeners(d.pid)] == [("127.0.0.2", port)]
    with pytest.raises(urllib.error.URLError):
        scrape("127.0.0.1", port)  # bound where configured, not on the default address
    text = scrape("127.0.0.2", port)
    for name in ("metaltune_gpu_temperature_celsius", "metaltune_gpu_power_usage_watts",
                 "metaltune_gpu_sm_clock_hertz", "metaltune_gpu_memory_clock_hertz"):
        assert len(samples(text, name)) == 2, name  # both simulated GPUs, gpu and UUID labels
        assert f"# TYPE {name} gauge" in text
    # clocks in hertz (the simulated H200 runs its SM between 345 MHz and 1,980 MHz)
    assert all(3e8 <= v <= 2e9 for v in samples(text, "metaltune_gpu_sm_clock_hertz"))
    assert all(0 < v < 1500 for v in samples(text, "metaltune_gpu_power_usage_watts"))
    assert "# TYPE metaltune_trials_total counter" in text and "# TYPE metaltune_incidents_total counter" in text
    for old in ("metaltune_gpu_temp{", "metaltune_power_usage{", "metaltune_sm_clock{"):
        assert old not in text


def test_idle_connections_are_capped_and_closed_and_cost_no_thread(tmp_path, sim_host, start_daemon):
    """Issue 42, item 9: 200 idle connections took the daemon from 4 to ~175 threads, none
    closed. Now they wait in a selector, are capped (max_connections) and closed when idle
    (idle_timeout_s), and a scrape still gets through while they are open."""
    import socket
    import time

    port = free_port()
    cfg = write_config(tmp_path / "c.toml", sim_host, tmp_path)
    cfg.write_text(cfg.read_text() + f'[metrics]\nenabled = true\nport = {port}\n'
                   'idle_timeout_s = 2.0\nmax_connections = 16\n')
    d = start_daemon(cfg)
    d.wait_ready()
    assert "metaltune_gpu_power_usage_watts" in scrape("127.0.0.1", port)
    before = psutil.Process(d.pid).num_threads()
    conns = []
    try:
        for _ in range(200):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            conns.append(s)
        time.sleep(0.5)
        assert psutil.Process(d.pid).num_threads() <= before + 3, (before, psutil.Process(d.pid).num_threads())
        established = [c for c in psutil.Process(d.pid).net_connections(kind="inet")
                       if c.status == psutil.CONN_ESTABLISHED]
        assert len(established) <= 16, len(established)
        t0 = time.monotonic()  # the cap is full of idle ones: a scrape still gets in, at once
        assert "metaltune_gpu_power_usage_watts" in scrape("127.0.0.1", port)
        assert time.monotonic() - t0 < 1.5
        time.sleep(3)  # past the idle timeout: every idle one is closed by the daemon
        for s in conns:
            s.settimeout(1)
            try:
                assert s.recv(1) == b""
            except ConnectionResetError:
                pass
        assert psutil.Process(d.pid).num_threads() <= before + 3
    finally:
        for s in conns:
            s.close()
    assert d.stop() == 0
