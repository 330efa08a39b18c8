#!/usr/bin/env bash
# `metaltune search mixed` against library kernels on the H200: build FlashMLA from the measuring
# kit (never part of the project; dense + sparse_bf16, in parallel), make it importable
# ($METALTUNE_FLASHMLA_EXT, the kit's flash_mla package on PYTHONPATH, passed on to the judge's
# child), then for the DeepSeek-V3 and V3.2 workloads:
#   search mixed (benchmarks/search_mixed_h200.sh: kernel slots only, host knobs none; the
#   incumbent is the empty table, so every slot starts on the best library kernel) and the kept
#   table replayed outside the search (bench_kept_table.py: plain torch / kept table / library
#   only, per size).
#   bash benchmarks/library_search_h200.sh OUT KIT      (KIT: the kit folder, .kits/flashmla)
# env: DENSE (the V3 workload, default deepseek), SPARSE (default deepseek-v3.2:batch=8,32:ctx=131072),
#      BUDGET_DENSE / BUDGET_SPARSE (trials, 7 / 5), END_S (stop starting stages after this many
#      seconds, 520), BUILD=0 (the parts are already in $PEER_MLA_BUILD), PYTHON, WHL (the
#      wheels folder where python lacks pydantic/optuna: ../../.whl, the checkout root's, seen
#      from .gpu/<name>).
set -u
PY=${PYTHON:-python3}
out=${1:?OUT}; kit=${2:?KIT}
build=${PEER_MLA_BUILD:-/tmp/peer_mla_build}
t0=$(date +%s); end=$(( t0 + ${END_S:-520} ))
left() { echo $(( end - $(date +%s) )); }
mkdir -p "$out" /tmp/library_search_logs
if [ "${BUILD:-1}" = 1 ]; then
  PARTS=${PARTS:-"dense sparse_bf16"} PART_TIMEOUT_S=${PART_TIMEOUT_S:-200} \
    LOG_DIR=/tmp/library_search_logs bash "$kit/build_flashmla.sh" "$build"
  cp -f "$build"/*.json /tmp/library_search_logs/ 2>/dev/null
  tar -czf "$out/build_logs.tgz" -C /tmp library_search_logs
fi
echo "[library_search] build done at $(( $(date +%s) - t0 ))s"
. "$(dirname "$0")/flashmla_ext.sh"
METALTUNE_FLASHMLA_EXT=$(flashmla_ext "$build" "$PY")
export METALTUNE_FLASHMLA_EXT
# the judge's child builds its environment from an allow-list: name the library's variable
export KERNELSEARCH_SANDBOX_PASS_ENV=METALTUNE_FLASHMLA_EXT KERNELSEARCH_SANDBOX_USER=none
site=
if ! "$PY" -c "import pydantic, optuna" 2>/dev/null; then  # the bare image: carried wheels
  whl=${WHL:-../../.whl}
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$whl"/*.whl || { echo "[library_search] no wheels in $whl"; exit 1; }
  site=/tmp/site:
fi
export PYTHONPATH="$site$PWD:$(cd "$kit" && pwd)/third_party/FlashMLA"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
"$PY" -c "import json; from kernelsearch import libraries; print(json.dumps(libraries.report()))" \
  | tee "$out/discovery.json"
rc=0
# V3.2 first: its batch-8 size is where a searched kernel beat the library in the kernel bench
for spec in "sparse ${SPARSE:-deepseek-v3.2:batch=8,32:ctx=131072} ${BUDGET_SPARSE:-5} 210" \
            "dense ${DENSE:-deepseek} ${BUDGET_DENSE:-7} 220"; do
  set -- $spec; tag=$1 wl=$2 budget=$3 cap=$4
  room=$(( $(left) - 10 ))
  [ "$room" -gt "$cap" ] && room=$cap
  if [ "$room" -lt 60 ]; then echo "[library_search] $tag: skipped, ${room}s left"; rc=1; continue; fi
  echo "[library_search] $tag: $wl, budget $budget, at most ${room}s, started at $(( $(date +%s) - t0 ))s"
  WORKLOAD=$wl RUNTIME=off MAX_CHOICES=3 ROUNDS=2 REPEATS=2 \
    timeout -k 5 "$room" bash benchmarks/search_mixed_h200.sh "$out/$tag" "$budget" || rc=1
  # cut off at its cap: the trials stored so far (the table is written only at the end)
  [ -s "$out/$tag/trials.json" ] || "$PY" -m tuner --state-dir "$out/$tag/state" trials --json \
    > "$out/$tag/trials.json" 2>/dev/null
  echo "[library_search] $tag done at $(( $(date +%s) - t0 ))s"
done
# a few of the judge's records per trial, for the note (what it timed against the library)
"$PY" - "$out" <<'PY' || true
import json, pathlib, sys
for tag in ("dense", "sparse"):
    p = pathlib.Path(sys.argv[1]) / tag / "trials.json"
    if not p.exists():
        continue
    print(f"[{tag}] | trial | verdict:reason | slot: choice (judge x torch, x library) |")
    for t in json.loads(p.read_text())["trials"]:
        ks = [f"{n.split(':')[-1]}: {(c.get('kind') or '')} x{c.get('speedup_vs_torch') or 0:.2f} "
              f"x{c.get('speedup_vs_library') or 0:.2f}"
              for n, c in ((t.get("measurements") or {}).get("kernels") or {}).items()]
        print(f"[{tag}] |", t["number"], "|", f"{t['verdict']}:{t['reason']}", "|", "; ".join(ks) or "-", "|")
PY
echo "[library_search] total $(( $(date +%s) - t0 ))s"
exit $rc
