#!/usr/bin/env bash
# MLA decode round 3 (issue 45) on the H200, one device call with a deadline: build FlashMLA's
# three parts from the measuring kit (dense decode, sparse bf16, sparse FP8; never part of the
# project), make them importable for kernelsearch.libraries, then bench_mla_round3.py over every
# new case (heads 16/32/64/128 x s_q 1,2 x contexts 4k..128k x a ragged batch; dense, sparse
# bf16, FP8): the project's kernels against FlashMLA, outputs checked against the float64
# reference, a JSON and a table with % of the memory floor. Cases left at the deadline are
# written as skipped. A warm machine keeps the build (PEER_MLA_BUILD): a second call skips it.
#   bash benchmarks/mla_round3_h200.sh OUT KIT      (KIT: the kit folder, .kits/flashmla)
# env: DEADLINE_S (the whole call, default 560: a device call may run 600), BUILD_S (cap on the
#      build, 330), PARTS (FlashMLA parts, "dense sparse_bf16 sparse_fp8"), PART_TIMEOUT_S (200),
#      ARGS (more bench_mla_round3.py arguments, e.g. "--heads 16,32 --kinds dense"),
#      DRY_RUN=1 (no build, no GPU: print the plan), PYTHON (python3).
set -u
out=${1:?OUT}; kit=${2:?KIT}
PY=${PYTHON:-python3}
here=$(cd "$(dirname "$0")" && pwd)
if [ "${DRY_RUN:-0}" = 1 ]; then
  exec "$PY" "$here/bench_mla_round3.py" --dry-run ${ARGS:-}
fi
deadline=${DEADLINE_S:-560}
t0=$(date +%s)
build=${PEER_MLA_BUILD:-/tmp/peer_mla_build}
mkdir -p "$out" /tmp/mla_round3_logs
if [ ! -f "$build/dense.json" ]; then
  PARTS=${PARTS:-"dense sparse_bf16 sparse_fp8"} PART_TIMEOUT_S=${PART_TIMEOUT_S:-200} \
    LOG_DIR=/tmp/mla_round3_logs timeout -k 5 "${BUILD_S:-330}" bash "$kit/build_flashmla.sh" "$build"
  cp -f "$build"/*.json /tmp/mla_round3_logs/ 2>/dev/null
  tar -czf "$out/build_logs.tgz" -C /tmp mla_round3_logs
fi
echo "[mla_round3] build done at $(( $(date +%s) - t0 ))s"
. "$here/flashmla_ext.sh"
METALTUNE_FLASHMLA_EXT=$(flashmla_ext "$build" "$PY")
export METALTUNE_FLASHMLA_EXT
export PYTHONPATH="$PWD:$(cd "$kit" && pwd)/third_party/FlashMLA"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
"$PY" -c "import json; from kernelsearch import libraries; print(json.dumps(libraries.report()))" \
  > "$out/discovery.json" 2>&1
# what is left of the call, less 30 s to write the table and hand the files back
left=$(( deadline - ($(date +%s) - t0) - 30 ))
if [ "$left" -lt 30 ]; then
  echo "[mla_round3] no time left for the sweep after the build ($left s)"; exit 1
fi
timeout -k 5 $(( left + 20 )) "$PY" "$here/bench_mla_round3.py" --out "$out" --deadline-s "$left" \
  ${ARGS:-} 2>&1
rc=$?
echo "[mla_round3] total $(( $(date +%s) - t0 ))s (device seconds of this call), bench rc $rc"
exit $rc
