"""Idle daemon footprint: CPU (% of one core) and resident memory of `metaltune daemon` on a
simulated host with 1 s health sampling, after start-up, over a measurement window.

    .venv/bin/python benchmarks/bench_daemon.py [--seconds 40] [--interval 1.0] [--sku h200] [--gpus 8]

Targets (issue 7): < 1 % of one core, < 100 MB RSS. CPU counts the daemon and every child it
forked (utime+stime+cutime+cstime from /proc/PID/stat); the start-up cost is reported apart.
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # fields after ")" start at index 0 = state (field 3): utime=14, stime=15, cutime=16, cstime=17
    return sum(int(f[i]) for i in (11, 12, 13, 14)) / TCK


def mem_kib(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM", "RssAnon", "Threads"):
            out[k] = int(v.split()[0])
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--interval", type=float, default=1.0, help="health_interval_s")
    ap.add_argument("--sku", default="h200")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--metrics", action="store_true", help="also serve the Prometheus endpoint")
    ap.add_argument("--scrape", type=float, default=15.0,
                    help="with --metrics: scrape /metrics every S seconds, as Prometheus would (0: never)")
    a = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="mt-bench-"))
    env = {**os.environ, "PYTHONPATH": str(REPO), "METALTUNE_RUN_DIR": str(tmp / "run")}
    env.pop("METALTUNE_NO_DAEMON", None)
    sim = tmp / "sim"
    subprocess.run([sys.executable, "-m", "tuner", "sim", "init", str(sim), "--sku", a.sku,
                    "--gpus", str(a.gpus)], check=True, env=env, capture_output=True)
    cfg = tmp / "config.toml"
    port = _free_port()
    cfg.write_text(
        f'backend = "sim"\nsim_root = "{sim}"\nstate_dir = "{tmp / "state"}"\n'
        f'run_dir = "{tmp / "run"}"\nhealth_interval_s = {a.interval}\n'
        f'[metrics]\nenabled = {"true" if a.metrics else "false"}\nport = {port}\n')
    ns = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    ns.bind(str(tmp / "notify.sock"))
    ns.settimeout(60)
    env.update(NOTIFY_SOCKET=str(tmp / "notify.sock"), WATCHDOG_USEC="10000000")
    t0 = time.monotonic()
    p = subprocess.Popen([sys.executable, "-m", "tuner", "daemon", "--config", str(cfg)], env=env,
                         stdout=open(tmp / "daemon.log", "w"), stderr=subprocess.STDOUT)
    try:
        while b"READY=1" not in ns.recv(4096):
            pass
        ready_s = time.monotonic() - t0
        import threading

        def drain() -> None:  # keep reading, as systemd does (watchdog pings, STATUS)
            while True:
                try:
                    ns.recv(4096)
                except OSError:
                    return

        threading.Thread(target=drain, daemon=True).start()
        time.sleep(2.0)  # let the first health ticks settle
        c0, w0 = cpu_seconds(p.pid), time.monotonic()
        start_cpu = c0
        peak = 0
        samples = []
        scrapes, next_scrape = 0, w0
        while time.monotonic() - w0 < a.seconds:
            time.sleep(1.0)
            if a.metrics and a.scrape > 0 and time.monotonic() >= next_scrape:
                import urllib.request

                urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
                scrapes += 1
                next_scrape += a.scrape
            m = mem_kib(p.pid)
            peak = max(peak, m["VmRSS"])
            samples.append(m["VmRSS"])
        c1, w1 = cpu_seconds(p.pid), time.monotonic()
        m = mem_kib(p.pid)
        ticks = sum(1 for line in open(tmp / "daemon.log") if "event=" in line)
    finally:
        p.terminate()
        p.wait(timeout=30)
    cpu_pct = 100.0 * (c1 - c0) / (w1 - w0)
    rows = [
        ("simulated host", f"{a.sku} x{a.gpus} GPUs"),
        ("health interval", f"{a.interval:g} s"),
        ("metrics", f"on, scraped every {a.scrape:g} s ({scrapes} scrapes)" if a.metrics else "off"),
        ("start-up to READY", f"{ready_s:.2f} s (CPU {start_cpu:.2f} s)"),
        ("window", f"{w1 - w0:.1f} s"),
        ("CPU, % of one core", f"{cpu_pct:.3f} %   (target < 1 %)"),
        ("RSS now / peak", f"{m['VmRSS'] / 1024:.1f} MB / {max(peak, m['VmHWM']) / 1024:.1f} MB   (target < 100 MB)"),
        ("RSS anon", f"{m['RssAnon'] / 1024:.1f} MB"),
        ("threads", str(m["Threads"])),
        ("log lines", str(ticks)),
        ("exit code on SIGTERM", str(p.returncode)),
    ]
    w = max(len(k) for k, _ in rows)
    print(f"{'metric'.ljust(w)} | value")
    print(f"{'-' * w}-+-{'-' * 40}")
    for k, v in rows:
        print(f"{k.ljust(w)} | {v}")
    ok = cpu_pct < 1.0 and max(peak, m["VmHWM"]) < 100 * 1024
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


if __name__ == "__main__":
    sys.exit(main())
