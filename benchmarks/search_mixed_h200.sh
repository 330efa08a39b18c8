#!/usr/bin/env bash
# The product loop on a GPU machine whose host settings must not change (the lent H200):
# `metaltune search mixed` over a workload's kernel slots and runtime settings, host knobs left
# out (--knob none: nothing is written to the GPU), then the kept table replayed outside the
# search: bench_kept_table.py (deepseek, llama) or the plain user script with `patch` (hf:).
#   bash benchmarks/search_mixed_h200.sh OUT [BUDGET]
# env: WORKLOAD (deepseek | deepseek-v3.2 | llama | hf:<config>[:layers=N]; default deepseek),
#      FAMILY (space-separated; default mla_decode for deepseek, mla_sparse_decode for v3.2,
#      every family the workload calls otherwise), RUNTIME (on|off, default on), SUGGEST (auto:
#      the tables shipped for this GPU | none | a path), PROPOSER (coordinate), MAX_CHOICES (3),
#      ROUNDS (2), REPEATS (2), USER_CTX (hf: the user script's contexts, 4096,32768), PYTHON.
# Needs pydantic/optuna/typer wheels in .whl (device/README.md says how) when the machine's
# python lacks them. A PYTHONPATH set by the caller (a library's Python package) is kept.
set -uo pipefail
PY=${PYTHON:-python3}
out=${1:?OUT}; budget=${2:-5}
wl=${WORKLOAD:-deepseek}
if ! "$PY" -c "import pydantic, optuna, typer" 2>/dev/null && [ -d .whl ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
else
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
# the working tree may sit where an unprivileged sandbox user cannot read it
export KERNELSEARCH_SANDBOX_USER=${KERNELSEARCH_SANDBOX_USER:-none}
export PYTHONUNBUFFERED=1
case "$wl" in
  deepseek|deepseek:*) fams=${FAMILY:-mla_decode} ;;
  deepseek-v3.2|deepseek-v3.2:*) fams=${FAMILY:-mla_sparse_decode} ;;
  *) fams=${FAMILY:-} ;;
esac
fam_args=(); for f in $fams; do fam_args+=(--family "$f"); done
rt_arg=--runtime; [ "${RUNTIME:-on}" = off ] && rt_arg=--no-runtime
mkdir -p "$out/state"
"$PY" -m tuner --backend real --state-dir "$out/state" search mixed --workload "$wl" \
  --knob none "${fam_args[@]}" "$rt_arg" --suggest-table "${SUGGEST:-auto}" \
  --proposer "${PROPOSER:-coordinate}" --budget "$budget" --max-choices "${MAX_CHOICES:-3}" \
  --rounds "${ROUNDS:-2}" --repeats "${REPEATS:-2}" --seed 1 --json \
  > "$out/search-mixed.json" 2> "$out/search-mixed.err"
rc=$?
tail -5 "$out/search-mixed.err"
"$PY" -m tuner --state-dir "$out/state" trials --json > "$out/trials.json" 2>/dev/null
"$PY" - "$out" <<'PY'
import json, sys
out = sys.argv[1]
try:
    res = json.load(open(f"{out}/search-mixed.json"))
except Exception as e:
    print("no result:", e); sys.exit(0)
print(json.dumps({k: res.get(k) for k in ("trials", "by_verdict", "by_kind", "kept", "slots", "baseline", "seconds")}, indent=1))
try:
    print("| trial | verdict:reason | change (kernels: slot bucket variant config; runtime) | gain | per size: incumbent -> candidate tok/s |")
    print("|---|---|---|---|---|")
    for t in json.load(open(f"{out}/trials.json"))["trials"]:
        c = t.get("candidate") or {}
        ks = [f"{k['shape_bucket']} {k['variant']} {json.dumps(k['config'], sort_keys=True)}"
              for k in c.get("kernels") or []]
        rt = [f"{k}={v}" for k, v in (c.get("runtime") or {}).items()]
        per = ((t.get("measurements") or {}).get("holistic") or {}).get("per_size") or {}
        sizes = "; ".join(f"{k}: {v['incumbent']:.0f} -> {v['candidate']:.0f}" for k, v in per.items()
                          if isinstance(v, dict) and v.get("candidate") is not None)
        print("|", t["number"], "|", f"{t['verdict']}:{t['reason']}", "|", "; ".join(ks + rt) or "-",
              "|", "-" if t.get("gain") is None else f"{t['gain']:+.3f}", "|", sizes or "-", "|")
except Exception as e:
    print("trials:", e)
# what the kept table runs at each slot, in dispatch's order: its entry, else the best library
# kernel offered there (a "torch" slot runs that library kernel where one is found), else torch
try:
    from kernelsearch.families import get
    from kernelsearch.table import DispatchTable
    t = DispatchTable.load(res["table"])
    print("| slot | kept label | runs (table / library / torch) |")
    print("|---|---|---|")
    for name in res.get("slots") or []:
        fam, bucket = name.split(".", 2)[1:]
        dtype, shape = bucket.split(":")
        f = get(fam)
        how, e, v = t.choose(fam, dtype, f.dims_dict(tuple(int(x) for x in shape.split("x"))))
        cfg = json.dumps(e.config, sort_keys=True) if e is not None else ""
        print("|", name, "|", (res["kept"]["kernels"].get(name) or "torch")[:60], "|", how, v or "", cfg, "|")
except Exception as e:
    print("slots:", type(e).__name__, e)
PY
table=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["table"])' "$out/search-mixed.json" 2>/dev/null)
kept_rt=$("$PY" -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["kept"]["runtime"]))' "$out/search-mixed.json" 2>/dev/null)
[ -n "$kept_rt" ] || kept_rt='{}'
if [ -n "$table" ] && [ -f "$table" ]; then
  cp "$table" "$out/table.json"  # the kept dispatch table
  case "$wl" in
    hf:*)
      spec=${wl#hf:}; cfg=${spec%%:*}; layers=$(echo "$spec" | sed -n 's/.*layers=\([0-9]*\).*/\1/p')
      eager=(); case "$kept_rt" in *'"compile": false'*) eager=(--no-compile) ;; esac
      for t in "$table" none; do
        "$PY" examples/hf_user_decode.py --table "$t" --config "$cfg" --layers "${layers:-4}" \
          --ctx "${USER_CTX:-4096,32768}" "${eager[@]}" --json "$out/user-$(basename "$t" .json).json" || rc=1
      done ;;
    *)
      "$PY" benchmarks/bench_kept_table.py --workload "$wl" --table "$table" \
        --trials "$out/trials.json" --runtime "$kept_rt" --out "$out" || rc=1 ;;
  esac
fi
exit $rc
