"""The judge's library mode on the GPU: each library variant this host offers judged like any
candidate (correctness at scale and at the boundary lengths, poisoned allocations, CUDA-graph
replays, timing A/B against torch), then a Triton variant judged with the library yardstick
(its A/B against the best library kernel at the shape). Prints one JSON line per verdict.

  python3 benchmarks/check_library.py [--out FILE] [--quick]"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# (family, variant, config, timed shape): the libraries at the 64 x 4k, and the sparse
# Triton kernel at 8 x 128k where it beat FlashMLA's bf16 sparse kernel on 2026-12-01
JOBS = [("mla_decode", "flashmla", {}, (64, 128, 4096, 64, 0)),
        ("mla_sparse_decode", "flashmla_sparse", {}, (64, 128, 4096, 64, 2048, 0)),
        ("mla_sparse_decode", "splitkv", dict(BLOCK_H=64, BLOCK_N=32, GRID=1056, STAGES=3,
                                              num_warps=8), (8, 128, 131072, 64, 2048, 0))]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    from kernelsearch import libraries
    from kernelsearch.families import get
    from kernelsearch.harness import check, floor_for

    print(json.dumps({"libraries": libraries.report()}), flush=True)
    out = []
    for family, name, cfg, shape in JOBS:
        fam = get(family)
        var = fam.variants[name]
        if var.kind == "library" and not var.configs(shape):
            out.append({"family": family, "variant": name, "skipped": "not offered here"})
            print(json.dumps(out[-1]), flush=True)
            continue
        t0 = time.time()
        lib = {"library": var.library} if var.kind == "library" else {}
        v = check(family, var.file, cfg, device="cuda", timing_shapes=[shape],
                  shapes=[shape[:-1] + (1,)], random_shapes=1, seeds=1, graph=True, reps=10,
                  ceilings=floor_for("cuda"), timeout_s=240, **lib)
        t = next(iter(v.timings.values()), {})
        out.append({"family": family, "variant": name, "kind": v.kind, "library": v.library,
                    "verdict": v.verdict, "code": v.code, "rule": v.rule,
                    "detail": v.detail[:300], "timed": list(shape),
                    "median_us": t.get("median_us"), "graph_us": t.get("graph_us"),
                    "speedup_vs_torch": t.get("speedup_vs_torch"),
                    "vs_library": t.get("library"),
                    "speedup_vs_library": t.get("speedup_vs_library"),
                    "library_spread": t.get("library_spread"),
                    "checked_shapes": v.checked_shapes, "checks": len(v.checks),
                    "seconds": round(time.time() - t0, 1)})
        print(json.dumps(out[-1]), flush=True)
        if a.out:
            Path(a.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
