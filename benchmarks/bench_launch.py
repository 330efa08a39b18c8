"""Where the launch-bound timings come from: for each dispatch-table entry (and torch's own op) at
its measured shape, four numbers side by side:

  cpu_us      host time of one call (Python wrapper + Triton/ATen launch), GPU kept busy so the
              queue never blocks: what an eager caller pays on the CPU per call
  flush_us    the harness's events mode: L2 flush, start event, call, end event
  hidden_us   the same, with a GPU sleep queued between the flush and the start event, long enough
              that the call is already queued when the start event fires: GPU time only
  graph_us    per call inside one CUDA graph (what a CUDA-graph runtime sees)

If flush_us ~ cpu_us - (flush duration) while hidden_us ~ graph_us, the events mode was timing the
host launch, not the kernel. Run on a GPU:

    python3 benchmarks/bench_launch.py --table host_profiles/kernels/h200-graphs.json --out DIR
"""
from __future__ import annotations

import argparse
import functools
import importlib
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from kernelsearch.families import get  # noqa: E402
from kernelsearch.harness.timing import (Flusher, bench_graph, host_cost,  # noqa: E402
                                          sleep_cycles_per_us)


def events_us(fn, arg_sets, reps: int, hide_us: float, cyc_per_us: float) -> float:
    fl = Flusher("cuda")
    st = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    en = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    torch.cuda.synchronize()
    for i in range(reps):
        fl()
        if hide_us:
            torch.cuda._sleep(int(cyc_per_us * hide_us))
        st[i].record()
        fn(*arg_sets[i % len(arg_sets)])
        en[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1e3 for s, e in zip(st, en))


def flush_us(cyc_per_us: float) -> float:
    fl = Flusher("cuda")
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(10):
        torch.cuda.synchronize()
        e0.record()
        fl()
        e1.record()
        torch.cuda.synchronize()
        out.append(e0.elapsed_time(e1) * 1e3)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--table", default="host_profiles/kernels/h200-graphs.json")
    ap.add_argument("--out", default=None)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--hide-us", type=float, default=300.0)
    a = ap.parse_args()
    table = json.loads(Path(a.table).read_text())
    cyc = sleep_cycles_per_us()
    fl = flush_us(cyc)
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  sleep {cyc:.0f} cycles/us  "
          f"L2 flush {fl:.1f} us")
    rows = []
    gen = torch.Generator().manual_seed(0)
    for e in table["entries"]:
        fam = get(e["family"])
        shape = tuple(e["measured"][0]["shape"])
        dtype = getattr(torch, e["dtype"])
        sets = [fam.make_inputs(shape, dtype, "cuda", gen) for _ in range(4)]
        mod = importlib.import_module(f"kernelsearch.families.{e['family']}.{e['variant']}")
        ours = functools.partial(mod.forward, **e["config"])
        for who, fn in (("ours", ours), ("torch", fam.torch_default)):
            for s in sets[:2]:
                fn(*s)
            torch.cuda.synchronize()
            r = {"family": e["family"], "shape": "x".join(map(str, shape)), "who": who,
                 "variant": e["variant"] if who == "ours" else "torch",
                 "cpu_us": host_cost(fn, sets[:1], "cuda", a.calls) * 1e6,
                 "flush_us": events_us(fn, sets, a.reps, 0.0, cyc),
                 "hidden_us": events_us(fn, sets, a.reps, a.hide_us, cyc),
                 "graph_us": bench_graph(fn, sets, replays=20)["median_s"] * 1e6}
            rows.append(r)
            print(f"{r['family']:17s} {r['shape']:20s} {r['variant']:10s} cpu {r['cpu_us']:7.1f}  "
                  f"flush {r['flush_us']:7.1f}  hidden {r['hidden_us']:7.1f}  graph {r['graph_us']:7.1f}",
                  flush=True)
    print()
    print("| family | shape | ours: cpu / flush / hidden / graph us | torch: cpu / flush / hidden / graph us "
          "| x torch flush | x torch hidden | x torch graph |")
    print("|---|---|---|---|---|---|---|")
    for o, t in zip(rows[::2], rows[1::2]):
        print(f"| {o['family']} | {o['shape']} | {o['cpu_us']:.1f} / {o['flush_us']:.1f} / "
              f"{o['hidden_us']:.1f} / {o['graph_us']:.1f} | {t['cpu_us']:.1f} / {t['flush_us']:.1f} / "
              f"{t['hidden_us']:.1f} / {t['graph_us']:.1f} | {t['flush_us'] / o['flush_us']:.2f} | "
              f"{t['hidden_us'] / o['hidden_us']:.2f} | {t['graph_us'] / o['graph_us']:.2f} |")
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "launch.json").write_text(json.dumps(
            {"device": torch.cuda.get_device_name(), "flush_us": fl, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
