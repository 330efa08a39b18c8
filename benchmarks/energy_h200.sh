#!/usr/bin/env bash
# Issue 34 on the H200, in one device call of at most 5 minutes: energy as the objective of a
# kernel search, nothing written to the GPU (host knobs none; NVML read only).
#   1. build FlashMLA's sparse_bf16 part from the measuring kit (~46 s there) and make it
#      importable ($METALTUNE_FLASHMLA_EXT, passed on to the judge's child);
#   2. `metaltune search mixed` on DeepSeek-V3.2 b8 x 128k twice, same seed, budget and choices:
#      `--objective throughput`, then `--objective energy` (each trial's A/B now carries tokens/J
#      and mean W per size: tuner/workloads/energy.py);
#   3. both kept tables replayed outside the search in one fresh workload process
#      (benchmarks/energy_replay.py): tokens/s, tokens/J and mean W of each, and the ratios
#      (target: the energy table's tokens/J >= 1.3x the throughput table's, tokens/s >= 0.95x).
#
#   bash benchmarks/energy_h200.sh OUT KIT       (KIT: the kit folder, .kits/flashmla)
# device run, from the checkout's root, carry [".kits", ".whl"] (the kit: `mkdir -p .kits;
# cp -r ../shared/kits/flashmla .kits/`; .whl: pydantic/optuna/typer wheels where the image
# lacks them, device/README.md):
#   PYTHONUNBUFFERED=1 bash benchmarks/energy_h200.sh $OUT .kits/flashmla 2>&1 | tee $OUT/run.log
# env: WORKLOAD (deepseek-v3.2:batch=8:ctx=131072), FAMILY (mla_sparse_decode), BUDGET (4 trials
#      a search), MAX_CHOICES (3), ROUNDS (2), REPEATS (2), SUGGEST (auto: the tables shipped for
#      this GPU, whose Triton kernel is the fast, hungry choice), PAIRS / REPLAY_REPEATS (2 / 3),
#      END_S (stop starting stages after this many seconds, 285), SEARCH_CAP_S (105 a search),
#      BUILD=0 (the part is already in $PEER_MLA_BUILD), NEED_LIBRARY=0 (go on without FlashMLA:
#      a CPU dry run), NO_OBJECTIVE=1 (leave --objective out: a dry run of the plumbing on a
#      branch without it), PYTHON, WHL (.whl), WORK (/tmp/energy_h200: the searches' state dirs).
# Files in OUT (at most 8 come back): run.log (the tee above), discovery.json,
# search-{throughput,energy}.json, table-{throughput,energy}.json, energy-replay.json, gpu.csv.
set -u
PY=${PYTHON:-python3}
out=${1:?OUT}; kit=${2:?KIT}
build=${PEER_MLA_BUILD:-/tmp/peer_mla_build}
work=${WORK:-/tmp/energy_h200}
wl=${WORKLOAD:-deepseek-v3.2:batch=8:ctx=131072}
t0=$(date +%s); end=$(( t0 + ${END_S:-285} ))
left() { echo $(( end - $(date +%s) )); }
at() { echo "[energy_h200] $* at $(( $(date +%s) - t0 ))s"; }
mkdir -p "$out" "$work"
# NVLink multicast stays off (device/KINDS.md), also in the children
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1

# -- 1. FlashMLA ---------------------------------------------------------------------------------
if [ "${BUILD:-1}" = 1 ] && [ -d "$kit" ]; then
  PARTS=${PARTS:-sparse_bf16} PART_TIMEOUT_S=${PART_TIMEOUT_S:-120} LOG_DIR="$work/build" \
    bash "$kit/build_flashmla.sh" "$build"
fi
at "build done"
. "$(dirname "$0")/flashmla_ext.sh"
METALTUNE_FLASHMLA_EXT=$(flashmla_ext "$build" "$PY")
export METALTUNE_FLASHMLA_EXT
# the judge's child builds its environment from an allow-list: name the library's variable
export KERNELSEARCH_SANDBOX_PASS_ENV=METALTUNE_FLASHMLA_EXT
# the working tree may sit where an unprivileged sandbox user cannot read it
export KERNELSEARCH_SANDBOX_USER=${KERNELSEARCH_SANDBOX_USER:-none}
site=
if ! "$PY" -c "import pydantic, optuna, typer" 2>/dev/null; then  # the bare image: carried wheels
  whl=${WHL:-.whl}
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$whl"/*.whl || { echo "[energy_h200] no wheels in $whl"; exit 1; }
  site=/tmp/site:
fi
kitpy=
[ -d "$kit/third_party/FlashMLA" ] && kitpy=:$(cd "$kit" && pwd)/third_party/FlashMLA
export PYTHONPATH="$site$PWD$kitpy${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c "import json; from kernelsearch import libraries; print(json.dumps(libraries.report()))" \
  > "$out/discovery.json"
cat "$out/discovery.json"
if [ "${NEED_LIBRARY:-1}" = 1 ] && ! grep -q '"flash_mla", "status": "present"' "$out/discovery.json"; then
  echo "[energy_h200] FlashMLA not found: the target compares against it; stopping"
  exit 1
fi
# the board as found (read only): name, power limit, draw, clocks
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,power.limit,power.draw,clocks.sm,clocks.mem \
  --format=csv > "$out/gpu.csv" 2>&1 && cat "$out/gpu.csv"

# -- 2. the two searches -------------------------------------------------------------------------
rc=0
fam_args=(); for f in ${FAMILY:-mla_sparse_decode}; do fam_args+=(--family "$f"); done
for obj in throughput energy; do
  room=$(( $(left) - 45 ))  # keep room for the replay
  cap=${SEARCH_CAP_S:-105}; [ "$room" -gt "$cap" ] && room=$cap
  if [ "$room" -lt 40 ]; then echo "[energy_h200] $obj: skipped, ${room}s left"; rc=1; continue; fi
  at "search mixed --objective $obj (at most ${room}s)"
  rm -rf "$work/$obj"; mkdir -p "$work/$obj"
  obj_args=(--objective "$obj"); [ "${NO_OBJECTIVE:-0}" = 1 ] && obj_args=()
  timeout -k 5 "$room" "$PY" -m tuner --backend real --state-dir "$work/$obj/state" search mixed \
    --workload "$wl" --knob none "${fam_args[@]}" --no-runtime --suggest-table "${SUGGEST:-auto}" \
    --proposer coordinate --budget "${BUDGET:-4}" --max-choices "${MAX_CHOICES:-3}" \
    --rounds "${ROUNDS:-2}" --repeats "${REPEATS:-2}" --seed 1 \
    "${obj_args[@]}" --json \
    > "$out/search-$obj.json" 2> "$work/$obj/search.err"
  r=$?; [ $r -eq 0 ] || { rc=1; echo "[energy_h200] $obj: exit $r"; }
  tail -3 "$work/$obj/search.err"
  "$PY" - "$out/search-$obj.json" "$out/table-$obj.json" "$obj" <<'PY' || rc=1
import json, shutil, sys
src, dst, obj = sys.argv[1:]
try:
    res = json.load(open(src))
except Exception as e:  # cut off at its cap: the table is written only at the end
    sys.exit(f"[energy_h200] {obj}: no result ({type(e).__name__}: {e})")
shutil.copyfile(res["table"], dst)
print(f"[energy_h200] {obj}: {res.get('trials')} trials {res.get('by_verdict')}; kept "
      f"{json.dumps((res.get('kept') or {}).get('kernels'))}; baseline {res.get('baseline')}")
PY
done
at "searches done"

# -- 3. the replay -------------------------------------------------------------------------------
if [ -f "$out/table-throughput.json" ] && [ -f "$out/table-energy.json" ]; then
  room=$(( $(left) + 10 )); [ "$room" -lt 30 ] && room=30
  at "replay (at most ${room}s)"
  timeout -k 5 "$room" "$PY" benchmarks/energy_replay.py --workload "$wl" \
    --table "throughput=$out/table-throughput.json" --table "energy=$out/table-energy.json" \
    --pairs "${PAIRS:-2}" --repeats "${REPLAY_REPEATS:-3}" --out "$out" || rc=1
else
  echo "[energy_h200] replay skipped: a search kept no table"; rc=1
fi
at "total"
exit $rc
