"""What torch.compile(mode="max-autotune-no-cudagraphs") generates for rmsnorm and softmax at the
shapes where it ties or edges our kernels: its Triton source (one file per shape) and the configs
its coordinate descent kept (the *.best_config files of inductor's cache, printed). Run on a GPU:

    python3 benchmarks/experiments/inductor_configs.py OUT_DIR

Results of 2026-11-30: benchmarks/results/inductor-h200-2026-11-30/ and
benchmarks/results/kernels-h200-2026-11-30.md (section 3)."""
import glob
import os
import sys

import torch
import torch.nn.functional as F
from torch._inductor.runtime.cache_dir_utils import cache_dir
from torch._inductor.utils import run_and_get_code

CASES = (("rmsnorm", lambda x, w: F.rms_norm(x, (x.shape[-1],), w, 1e-6),
          [(4096, 4096), (16384, 8192), (65536, 8192), (32768, 18992)]),
         ("softmax", lambda x: torch.softmax(x, -1), [(32768, 18992)]))


def main(out: str) -> int:
    for name, fn, shapes in CASES:
        for rows, cols in shapes:
            torch._dynamo.reset()
            x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
            args = (x, torch.randn(cols, device="cuda", dtype=torch.bfloat16)) if name == "rmsnorm" else (x,)
            _, codes = run_and_get_code(torch.compile(fn, mode="max-autotune-no-cudagraphs",
                                                      dynamic=False), *args)
            with open(os.path.join(out, f"inductor-{name}-{rows}x{cols}.txt"), "w") as f:
                f.write("\n\n#####\n\n".join(codes))
            print(name, rows, cols, "dumped", flush=True)
    for p in glob.glob(os.path.join(cache_dir(), "**", "*.best_config"), recursive=True):
        with open(p) as f:
            print("best config", os.path.basename(p), f.read())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
