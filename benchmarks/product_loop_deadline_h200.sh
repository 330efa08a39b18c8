#!/usr/bin/env bash
# The H200 product loop, timed for one share of device time: `search mixed` over an HF model's
# kernel slots and runtime settings with nothing written to the GPU (--knob none), then the
# trials table: each trial's verdict, reason and wall time. Issue 29: with no host change the
# transaction used to start the watchdog with a 30 s grace, and the compiled A/B (47 s) was
# rolled back as probation_expired; now a trial that writes nothing has no deadline at all.
#   bash benchmarks/product_loop_deadline_h200.sh OUT [BUDGET] [SEARCH_TIMEOUT_S]
# env: WORKLOAD (hf:llama3-8b:layers=4), ROUNDS (2), REPEATS (2), MAX_CHOICES (3), PYTHON.
# Needs pydantic/optuna/typer wheels in .whl where the machine's python lacks them.
set -uo pipefail
PY=${PYTHON:-python3}
out=${1:?OUT}; budget=${2:-3}; limit=${3:-170}
if ! "$PY" -c "import pydantic, optuna" 2>/dev/null && [ -d .whl ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export KERNELSEARCH_SANDBOX_USER=${KERNELSEARCH_SANDBOX_USER:-none} PYTHONUNBUFFERED=1
state=$(mktemp -d)
t0=$(date +%s)
# a search cut short by the timeout still leaves its finished trials in the store
timeout "$limit" "$PY" -m tuner --backend real --state-dir "$state" search mixed \
  --workload "${WORKLOAD:-hf:llama3-8b:layers=4}" --knob none --runtime --suggest-table auto \
  --proposer coordinate --budget "$budget" --max-choices "${MAX_CHOICES:-3}" \
  --rounds "${ROUNDS:-2}" --repeats "${REPEATS:-2}" --seed 1 --json \
  > "$out/search-mixed.json" 2> "$out/search-mixed.err"
echo "search rc=$? in $(( $(date +%s) - t0 )) s"
tail -3 "$out/search-mixed.err"
"$PY" -m tuner --state-dir "$state" trials --json --limit 0 > "$out/trials.json"
"$PY" - "$out" <<'PY'
import json, sys
out = sys.argv[1]
trials = sorted(json.load(open(f"{out}/trials.json"))["trials"], key=lambda t: t["number"])
print("| trial | verdict:reason | change | gain | seconds | per size: incumbent -> candidate tok/s |")
print("|---|---|---|---|---|---|")
for t in trials:
    c = t.get("candidate") or {}
    ks = [f"{k['shape_bucket']} {k['variant']}" for k in c.get("kernels") or []]
    rt = [f"{k}={v}" for k, v in (c.get("runtime") or {}).items()]
    per = ((t.get("measurements") or {}).get("holistic") or {}).get("per_size") or {}
    sizes = "; ".join(f"{k}: {v['incumbent']:.0f} -> {v['candidate']:.0f}" for k, v in per.items()
                      if isinstance(v, dict) and v.get("candidate") is not None)
    secs = t.get("duration_s") or sum(g.get("seconds") or 0 for g in t.get("gates") or [])
    print("|", t["number"], "|", f"{t['verdict']}:{t['reason']}", "|",
          "; ".join(ks[:3] + (["..."] if len(ks) > 3 else []) + rt) or "-", "|",
          "-" if t.get("gain") is None else f"{t['gain']:+.3f}", "|", f"{secs:.0f}", "|", sizes or "-", "|")
lost = [t["number"] for t in trials if "probation_expired" in (t.get("reason") or "")]
print(f"{len(trials)} trials; lost to a deadline: {lost or 'none'}")
PY
