"""Each named mla_decode kernel file run once at one shape (GRID 132), for a profiler to catch:

    ncu --clock-control none -k regex:'_mla_(pingpong|ahead)$' --section SpeedOfLight \
        --section WarpStateStats --section ComputeWorkloadAnalysis \
        --metrics smsp__sass_inst_executed_op_local_ld.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
        python3 benchmarks/experiments/mla_run_once.py 8x131072 \
        kernelsearch/families/mla_decode/gluon_pingpong.py benchmarks/experiments/gluon_ahead.py

(benchmarks/results/mla-gluon-h200-2026-12-03/ncu-pingpong-vs-ahead.txt; ncu reads the H200's
counters there, read only, clocks left alone)."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from kernelsearch.families import get  # noqa: E402
from kernelsearch.harness.sandbox import load  # noqa: E402

b, n = (int(x) for x in sys.argv[1].split("x"))
fam = get("mla_decode")
args = fam.make_inputs((b, 128, n, 64, 0), "bfloat16", "cuda", torch.Generator().manual_seed(0))
for path in sys.argv[2:]:
    load(Path(path).read_text(), Path(path).stem).forward(*args, GRID=132)
torch.cuda.synchronize()
print("ok")
