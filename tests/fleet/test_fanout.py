"""Bounded parallelism and per-host failure isolation of the fleet fan-out."""
import threading
import time

from tuner.fleet.inventory import Host
from tuner.fleet.remote import Outcome, fan_out
from tuner.fleet.ssh import HostUnreachable


def test_at_most_parallel_hosts_at_once_and_failures_stay_per_host():
    hosts = [Host(name=f"h{i}", address=f"10.0.0.{i}") for i in range(9)]
    lock = threading.Lock()
    now = peak = 0

    def step(h):
        nonlocal now, peak
        with lock:
            now += 1
            peak = max(peak, now)
        time.sleep(0.05)
        with lock:
            now -= 1
        if h.name == "h3":
            raise HostUnreachable(f"{h.name}: unreachable (ConnectionRefusedError)")
        if h.name == "h5":
            raise RuntimeError("bug in one host's step")
        return Outcome(h.name, True)

    res = fan_out(hosts, step, parallel=3)
    assert peak == 3
    assert list(res) == [h.name for h in hosts]                     # inventory order
    assert res["h3"].kind == "unreachable" and not res["h3"].ok
    assert res["h5"].kind == "error" and "bug in one host" in res["h5"].detail
    assert sum(o.ok for o in res.values()) == 7
