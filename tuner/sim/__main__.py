"""`python -m tuner.sim`: the simulated GPU model's numbers (baseline, optimum and gain per SKU,
and the cost of one measurement on a simulated host)."""
from __future__ import annotations

from tuner.sim import model
from tuner.sim.skus import SKUS


def _main() -> None:
    """python -m tuner.sim [--seed S] [--json]: the numbers the demo and benchmarks rely on."""
    import argparse
    import json
    import tempfile
    import time

    ap = argparse.ArgumentParser(prog="python -m tuner.sim")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows = [model.summary(n, a.seed) for n in SKUS]
    from tuner.sim.hostinit import init_host
    from tuner.sim.workload import SimWorkload

    with tempfile.TemporaryDirectory() as d:  # cost of one measurement on a real sim host
        w = SimWorkload(init_host(d + "/h", "h200", seed=a.seed, os_tree=False))
        w.measure(5)
        t0 = time.perf_counter()
        for _ in range(50):
            w.measure(5)
        ms = (time.perf_counter() - t0) / 50 * 1000
    if a.json:
        print(json.dumps({"skus": rows, "measure_ms_5_repeats": round(ms, 2)}, indent=1))
        return
    print(f"simulated GPU model, seed {a.seed} (noise-free, one GPU)\n")
    hdr = (f"{'sku':<8} {'baseline':>9} {'(clock, regime)':<36} {'optimum':>9} {'gain':>6}  settings")
    print(hdr)
    print("-" * (len(hdr) + 40))
    for r in rows:
        b, o = r["baseline"], r["optimum"]
        st = o["settings"]
        print(f"{r['sku']:<8} {b['throughput']:>9.1f} {str(b['clock_mhz']) + ' MHz, ' + b['regime']:<36} "
              f"{o['throughput']:>9.1f} {r['gain']:>6.1%}  clocks {st['locked_clocks_mhz']}, mem "
              f"{st['locked_mem_clocks_mhz']}, {st['power_limit_w']} W, offsets "
              f"{st['gpc_clock_offset_mhz']}/{st['mem_clock_offset_mhz']} MHz "
              f"(draws {o['power_draw_w']} W, {o['temp_c']} °C)")
    print(f"\nbaseline / optimum: " + ", ".join(
        f"{r['sku']} {r['baseline']['throughput'] / r['optimum']['throughput']:.1%}" for r in rows))
    print(f"SimWorkload.measure(5 repeats): {ms:.2f} ms per call (h200, one GPU)")


if __name__ == "__main__":
    _main()
