#!/usr/bin/env bash
# The product loop on a GPU machine whose host settings must not change (the lent H200):
# `metaltune search mixed` over the DeepSeek workload's mla_decode slots, host knobs left out
# (--knob none: nothing is written to the GPU), trials printed and kept in $OUT.
#   bash benchmarks/search_mixed_h200.sh OUT [BUDGET]
# Needs pydantic/optuna/typer wheels in .whl (device/README.md says how) when the machine's
# python lacks them.
set -uo pipefail
PY=${PYTHON:-python3}
out=${1:?OUT}; budget=${2:-5}
if [ -d .whl ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
# the working tree may sit where an unprivileged sandbox user cannot read it
export KERNELSEARCH_SANDBOX_USER=${KERNELSEARCH_SANDBOX_USER:-none}
export PYTHONUNBUFFERED=1
mkdir -p "$out/state"
"$PY" -m tuner --backend real --state-dir "$out/state" search mixed --workload deepseek \
  --knob none --family mla_decode --no-runtime --proposer "${PROPOSER:-coordinate}" --budget "$budget" \
  --max-choices "${MAX_CHOICES:-3}" --rounds 1 --repeats 2 --seed 1 --json > "$out/search-mixed.json" 2> "$out/search-mixed.err"
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
    print("trial | verdict:reason | kernels (slot bucket: variant config) | gain | per-size medians, tok/s")
    for t in json.load(open(f"{out}/trials.json"))["trials"]:
        ks = [f"{k['shape_bucket']}: {k['variant']} {json.dumps(k['config'], sort_keys=True)}"
              for k in (t.get("candidate") or {}).get("kernels") or []]
        per = ((t.get("measurements") or {}).get("holistic") or {}).get("per_size") or {}
        print(t["number"], "|", f"{t['verdict']}:{t['reason']}", "|", "; ".join(ks) or "-", "|",
              None if t.get("gain") is None else round(t["gain"], 4), "|",
              {k: round(v) if isinstance(v, (int, float)) else v for k, v in per.items()})
except Exception as e:
    print("trials:", e)
PY
exit $rc
