"""Host time of one eager call of a variant's wrapper, an older copy of it against the current one
and ATen's op, with the GPU queue kept full (so the number is Python + launch, not the kernel).
Run on a GPU, with the older wrappers copied out of git first:

    mkdir -p /tmp/before && for f in softmax/row softmax/split rmsnorm/row rmsnorm/streamed \\
        swiglu/rows matmul/skinny decode_attention/flashdec decode_attention/splitkv; do \\
      git show REV:kernelsearch/families/$f.py > /tmp/before/$(echo $f | tr / _).py; done
    python3 benchmarks/experiments/host_cost_before_after.py --before /tmp/before

Results of 2026-11-30 (REV dc293d9): benchmarks/results/host-cost-h200-2026-11-30.log."""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from kernelsearch.families import get  # noqa: E402
from kernelsearch.runtime import ensure_scratch_allocator  # noqa: E402


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def cost(fn, n: int = 300) -> float:
    """Median over 5 batches of the host time per call, a GPU sleep queued ahead of each batch."""
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(5):
        torch.cuda._sleep(int(1.98e3 * n * 300))
        t = time.perf_counter()
        for _ in range(n):
            fn()
        out.append((time.perf_counter() - t) / n * 1e6)
        torch.cuda.synchronize()
    return statistics.median(out)


def cases():
    dev, bf = "cuda", torch.bfloat16
    x = torch.randn(256, 4096, device=dev, dtype=bf)
    x3 = torch.randn(8, 1, 4096, device=dev, dtype=bf)
    xs = torch.randn(64, 18992, device=dev, dtype=bf)
    w = torch.randn(4096, device=dev, dtype=bf)
    u = torch.randn_like(x)
    a1, a8 = (torch.randn(m, 4096, device=dev, dtype=bf) for m in (1, 8))
    wt = torch.randn(4096, 4096, device=dev, dtype=bf).t()
    q, q1 = torch.randn(8, 32, 128, device=dev, dtype=bf), torch.randn(1, 32, 128, device=dev, dtype=bf)
    k, k1 = (torch.randn(b, 8, L, 128, device=dev, dtype=bf) for b, L in ((8, 4096), (1, 8192)))
    v, v1 = torch.randn_like(k), torch.randn_like(k1)
    da = get("decode_attention").torch_default
    return [
        ("softmax row 256x4096", "softmax/row", (x,), dict(ROWS=1, num_warps=4), lambda: torch.softmax(x, -1)),
        ("softmax row 8x1x4096 (3-D)", "softmax/row", (x3,), dict(ROWS=1, num_warps=4), lambda: torch.softmax(x3, -1)),
        ("softmax split 64x18992", "softmax/split", (xs,), dict(num_warps=32), lambda: torch.softmax(xs, -1)),
        ("rmsnorm row 256x4096", "rmsnorm/row", (x, w, 1e-6), dict(ROWS=1, num_warps=4), lambda: F.rms_norm(x, (4096,), w, 1e-6)),
        ("rmsnorm streamed 256x4096", "rmsnorm/streamed", (x, w, 1e-6), dict(BLOCK=1024, STAGES=1, num_warps=4), lambda: F.rms_norm(x, (4096,), w, 1e-6)),
        ("swiglu rows 256x4096", "swiglu/rows", (x, u), dict(BLOCK_R=1, BLOCK_C=1024, num_warps=4), lambda: F.silu(x) * u),
        ("matmul skinny 1x4096x4096", "matmul/skinny", (a1, wt), dict(BLOCK_N=32, BLOCK_K=512, SPLIT_K=1, STAGES=3, num_warps=4), lambda: a1 @ wt),
        ("matmul skinny 8x4096x4096", "matmul/skinny", (a8, wt), dict(BLOCK_N=32, BLOCK_K=256, SPLIT_K=1, STAGES=5, num_warps=4), lambda: a8 @ wt),
        ("decode flashdec 8x32x8x4096", "decode_attention/flashdec", (q, k, v), dict(BLOCK_N=64, SPLIT=2048, STAGES=2, num_warps=8), lambda: da(q, k, v)),
        ("decode splitkv 1x32x8x8192", "decode_attention/splitkv", (q1, k1, v1), dict(BLOCK_N=64, SPLIT=128, STAGES=3, num_warps=8), lambda: da(q1, k1, v1)),
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, type=Path, help="folder of older wrappers, family_variant.py")
    args = ap.parse_args()
    ensure_scratch_allocator()
    rows = []
    for label, var, call_args, cfg, torch_fn in cases():
        old = load(args.before / f"{var.replace('/', '_')}.py", "before_" + var.replace("/", "_"))
        new = importlib.import_module("kernelsearch.families." + var.replace("/", "."))
        same = torch.equal(old.forward(*call_args, **cfg), new.forward(*call_args, **cfg))
        rows.append((label, cost(torch_fn), cost(lambda: old.forward(*call_args, **cfg)),
                     cost(lambda: new.forward(*call_args, **cfg)), same))
        print(rows[-1], flush=True)
    print("\n| call | ATen us | before us | after us | same output |\n|---|---|---|---|---|")
    for label, t, b, a, same in rows:
        print(f"| {label} | {t:.1f} | {b:.1f} | {a:.1f} | {same} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
