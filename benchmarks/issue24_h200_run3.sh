#!/bin/bash
# Issue 24, third H200 run (one call): the kernel canary's cost in decode tokens/s, the shipped
# tables re-certified at their range ends and interior points, and the range_interior red-team
# candidate on the GPU (it compile-failed there at 32,769 columns before). Writes under $OUT:
#   canary.txt, recertify.log, recertify-h200.{jsonl,json,md}, rt/redteam-h200.{json,md}
#   bash benchmarks/issue24_h200_run3.sh [seconds in all, default 385]
set -o pipefail
export KERNELSEARCH_SANDBOX_USER=none PYTHONUNBUFFERED=1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True  # mixed sizes in one worker: no fragments
OUT=${OUT:?set OUT}
ALL=${1:-385}
T0=$(date +%s)
left() { echo $((ALL - ($(date +%s) - T0))); }
{
  date -u +%FT%TZ
  nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,clocks.max.sm,power.draw \
    --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} 2>&1 | tee "$OUT/recertify.log"
# 1. canary overhead first, alone on the GPU (the re-certification would be noise in it)
echo "== canary ($(left) s left)" | tee -a "$OUT/recertify.log"
timeout 120 python3 benchmarks/bench_canary.py --device cuda --config llama3-8b:layers=4 \
  --rounds 9 --steps 64 --batch 2 --json > "$OUT/canary.txt" 2>&1
echo "canary rc=$? ($(left) s left)" | tee -a "$OUT/recertify.log"
tail -c 1200 "$OUT/canary.txt"
# 2. the tables: the two entries that ran out of memory in run 1 first, then h200.json
#    (cheapest first), h200-mla.json (largest first), h200-graphs.json (cheapest first)
D=$(( $(left) - 75 )); [ "$D" -gt 230 ] && D=230
echo "== recertify, deadline $D s" | tee -a "$OUT/recertify.log"
timeout $((D + 30)) python3 benchmarks/recertify_tables.py --out "$OUT" \
  --tables h200.json,h200-mla.json,h200-graphs.json \
  --first h200-graphs.json:19,h200-graphs.json:32 --large-first h200-mla.json \
  --workers 8 --gpu-gib 130 --deadline-s "$D" --budget h200.json=100,h200-mla.json=120 \
  --by "benchmarks/issue24_h200_run3.sh (recertify_tables.py)" 2>&1 | tee -a "$OUT/recertify.log"
echo "recertify rc=$? ($(left) s left)" | tee -a "$OUT/recertify.log"
# 3. range_interior in events and graph mode, with the time that is left
L=$(( $(left) - 10 ))
if [ "$L" -gt 40 ]; then
  timeout "$L" python3 benchmarks/redteam_h200.py --out "$OUT/rt" --parallel 2 --gpu-gib 60 \
    --deadline-s $((L - 15)) --only "redteam/range_interior" 2>&1 | tail -8 \
    | tee -a "$OUT/recertify.log"
else
  echo "range_interior: not run, $L s left" | tee -a "$OUT/recertify.log"
fi
echo "done $(left) s left" | tee -a "$OUT/recertify.log"
