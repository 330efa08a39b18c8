"""Where gluon_pingpong's time goes on the H200 (issue 35): benchmarks/experiments/
mla_pingpong_ablate.py with parts taken away (ABL bits: 1 no softmax, 2 no rescale, 4 no wait for
the other warpgroup's P, 8 no P V), each with and without cache loads (PROBE), timed in a CUDA
graph on the same inputs as bench_mla_gluon. ABL=0 PROBE=0 is checked against the float64
reference (the others compute something else on purpose).

    python3 benchmarks/bench_mla_ablate.py --out DIR [--shapes 64x4096,8x131072]"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PEAK, BW = 735e12, 4.3e12
ABLATE = ROOT / "benchmarks" / "experiments" / "mla_pingpong_ablate.py"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="64x4096,8x131072")
    ap.add_argument("--abl", default="0,1,2,4,8,3,7")
    ap.add_argument("--kernels", default="",
                    help="instead: these gluon_pingpong-style files (forward(..., GRID=)), each "
                         "checked against the reference, then timed; FILE:KEY=INT:... passes "
                         "forward those keywords too (gluon_seesaw.py:LEAN=0:LOADER=0)")
    a = ap.parse_args()
    # before any import or output: a bad --kernels is one line, exit 2
    for k in filter(None, a.kernels.split(",")):
        path, *kv = k.split(":")
        if not Path(path).is_file() or not all(re.fullmatch(r"[A-Za-z_]\w*=-?\d+", x)
                                               for x in kv):
            ap.error(f"--kernels {k}: expected FILE or FILE:KEY=INT:... with FILE a kernel source")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    import torch

    from kernelsearch.families import get
    from kernelsearch.harness import timing as tm
    from kernelsearch.harness.correctness import compare
    from kernelsearch.harness.sandbox import load

    fam = get("mla_decode")
    rows = []
    t0 = time.time()
    if a.kernels:
        mods, kws = {}, {}
        for k in a.kernels.split(","):
            path, *kv = k.split(":")
            mods[k] = load(Path(path).read_text(), Path(path).stem)
            kws[k] = {x.split("=")[0]: int(x.split("=")[1]) for x in kv}
        for sh in a.shapes.split(","):
            b, n = (int(x) for x in sh.split("x"))
            shape = (b, 128, n, 64, 0)
            args = fam.make_inputs(shape, "bfloat16", "cuda", torch.Generator().manual_seed(0))
            ref = fam.reference(*args)
            sets = [args, fam.make_inputs(shape, "bfloat16", "cuda",
                                          torch.Generator().manual_seed(1))]
            floor = max(fam.bytes_moved(shape, 2) / BW, fam.flops(shape) / PEAK)
            for rep in range(2):  # twice, interleaved: the order's effect shows
                for k, m in mods.items():
                    for g in (132, 264):
                        try:
                            kw = dict(kws[k], GRID=g)
                            if rep == 0:
                                compare(m.forward(*args, **kw), ref, "bfloat16", fam, k)
                            t = tm.bench_graph(lambda *x, m=m, kw=kw: m.forward(*x, **kw), sets,
                                               replays=8)["median_s"]
                            r = {"shape": [b, n], "kernel": k, "GRID": g, "rep": rep,
                                 "us": t * 1e6, "pct_floor": 100 * floor / t}
                        except Exception as ex:  # noqa: BLE001
                            r = {"shape": [b, n], "kernel": k, "GRID": g,
                                 "error": f"{type(ex).__name__}: {str(ex)[:200]}"}
                        rows.append(r)
                        print(f"[{time.time() - t0:5.1f}s] {json.dumps(r)}", flush=True)
        (out / "mla-kernels.json").write_text(json.dumps(rows, indent=1))
        return 0
    mod = load(ABLATE.read_text(), "ablate")
    for sh in a.shapes.split(","):
        b, n = (int(x) for x in sh.split("x"))
        shape = (b, 128, n, 64, 0)
        args = fam.make_inputs(shape, "bfloat16", "cuda", torch.Generator().manual_seed(0))
        sets = [args, fam.make_inputs(shape, "bfloat16", "cuda", torch.Generator().manual_seed(1))]
        floor = max(fam.bytes_moved(shape, 2) / BW, fam.flops(shape) / PEAK)
        compare(mod.forward(*args), fam.reference(*args), "bfloat16", fam, "ablate ABL=0")
        for abl in (int(x) for x in a.abl.split(",")):
            for probe in (0, 1):
                cfg = dict(GRID=132, ABL=abl, PROBE=probe)
                try:
                    t = tm.bench_graph(lambda *x: mod.forward(*x, **cfg), sets,
                                       replays=8)["median_s"]
                    r = {"shape": [b, n], **cfg, "us": t * 1e6, "pct_floor": 100 * floor / t}
                except Exception as ex:  # noqa: BLE001 - a measurement: record and go on
                    r = {"shape": [b, n], **cfg, "error": f"{type(ex).__name__}: {str(ex)[:200]}"}
                rows.append(r)
                print(f"[{time.time() - t0:5.1f}s] {json.dumps(r)}", flush=True)
    (out / "mla-ablate.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
