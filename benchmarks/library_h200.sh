#!/usr/bin/env bash
# Library kernels on the H200: build FlashMLA from the measuring kit (never part of the
# project), make it importable for kernelsearch.libraries ($METALTUNE_FLASHMLA_EXT: the parts'
# .so files; the kit's copy of upstream's flash_mla interface on PYTHONPATH), then
#   1. discovery: what `metaltune kernel families` reports,
#   2. bench_mla at the issue's four sizes, both yardsticks (torch, best library kernel),
#   3. the judge's library mode (benchmarks/check_library.py),
#   4. the DeepSeek-V3 / V3.2 workload end to end through dispatch with the table bench_mla
#      built (library entries where the library is as fast; the fallback elsewhere).
#   bash benchmarks/library_h200.sh OUT KIT      (KIT: the kit folder, .kits/flashmla)
set -u
out=${1:?OUT}; kit=${2:?KIT}
build=${PEER_MLA_BUILD:-/tmp/peer_mla_build}
mkdir -p "$out" /tmp/library_h200_logs
t0=$(date +%s)
PARTS=${PARTS:-"dense sparse_bf16"} PART_TIMEOUT_S=${PART_TIMEOUT_S:-200} \
  LOG_DIR=/tmp/library_h200_logs bash "$kit/build_flashmla.sh" "$build"
cp -f "$build"/*.json /tmp/library_h200_logs/ 2>/dev/null
tar -czf "$out/build_logs.tgz" -C /tmp library_h200_logs
echo "[library_h200] build done at $(( $(date +%s) - t0 ))s"
. "$(dirname "$0")/flashmla_ext.sh"
METALTUNE_FLASHMLA_EXT=$(flashmla_ext "$build")
export METALTUNE_FLASHMLA_EXT
export PYTHONPATH="$PWD:$(cd "$kit" && pwd)/third_party/FlashMLA"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
python3 -c "import json; from kernelsearch import libraries; print(json.dumps(libraries.report()))" \
  | tee "$out/discovery.json"
shapes=64x128x4096x64x0,32x128x32768x64x0,8x128x131072x64x0,128x128x163840x64x0
shapes=$shapes,64x128x4096x64x2048x0,32x128x32768x64x2048x0,8x128x131072x64x2048x0,128x128x163840x64x2048x0
timeout -k 5 ${BENCH_S:-200} python3 benchmarks/bench_mla.py --out "$out/bench" --grid focused \
  --shapes "$shapes" --budget-s ${FAMILY_BUDGET_S:-80} --workers 12 \
  --e2e "${E2E:-32768}" --e2e-batch 32 2>&1
echo "[library_h200] bench done at $(( $(date +%s) - t0 ))s"
timeout -k 5 ${CHECK_S:-120} python3 benchmarks/check_library.py --out "$out/check.json" 2>&1
echo "[library_h200] total $(( $(date +%s) - t0 ))s"
