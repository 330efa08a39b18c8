"""Does a kept dispatch table reproduce, outside the search, the gain the search measured?

The table a `metaltune search mixed` run wrote (STATE_DIR/kernels/mixed-<run>.json) is installed
into a fresh workload process and A/B-measured against the plain path (no table: the torch ops)
and, where a library is found, against an empty table (every call the best library kernel is
offered for runs it: the all-library yardstick), rounds in ABC/CBA order, per size; beside it
the search's own numbers (the baseline it measured first, and the kept trials' candidate
medians) when its trials JSON is given.

    python3 benchmarks/bench_kept_table.py --workload deepseek --table T [--trials trials.json]
        [--pairs 2] [--repeats 3] [--out DIR]

Workloads: llama, deepseek[-v3.2][:batch=..][:ctx=..] (GPU presets on a GPU, tiny on the CPU),
hf:<config>.
Needs torch (and transformers for hf:); no pydantic: runs on the bare GPU machine."""
from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import asdict
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


#: the side with an empty table where a library is found (the all-library table: dispatch's
#: fallback runs the best library kernel at every call it is offered for)
LIBRARY_ONLY = "library only"


def make(workload: str):
    """The workload as `search mixed --workload` builds it (GPU presets on a GPU, tiny on the
    CPU); no host is needed for these."""
    from tuner.errors import BadInput
    from tuner.workloads.factory import make_workload

    if workload in ("sim", "sim-llama") or workload.startswith(("cmd:", "llama-tp")):
        raise BadInput(f"--workload: expected llama, deepseek, deepseek-v3.2 or hf:<config>, "
                       f"got {workload!r}")
    return make_workload(None, workload, None, 600.0)


def per_size(wl, repeats: int) -> dict[str, float]:
    """One measurement: per-size medians (the workload's own timing, outputs checked first)."""
    res = wl.bench.run(wl.runtime, repeats=repeats)
    return {k: statistics.median(v) for k, v in res["per_size_samples"].items()}


def search_numbers(path: str) -> dict[str, dict[str, float]]:
    """From `metaltune trials --json`: the run's baseline per size and, per size, the candidate
    median of the last kept trial that measured it."""
    doc = json.loads(Path(path).read_text())
    run = doc["runs"][-1]
    out = {"search baseline": dict(run["meta"]["baseline"].get("per_size") or {})}
    kept: dict[str, float] = {}
    for t in doc["trials"]:
        if t.get("verdict") == "kept":
            for k, v in ((t.get("measurements") or {}).get("holistic") or {}).get("per_size", {}).items():
                if isinstance(v, dict) and v.get("candidate") is not None:
                    kept[k] = v["candidate"]
    out["search kept"] = kept
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", required=True)
    ap.add_argument("--table", required=True, help="the kept dispatch table (JSON)")
    ap.add_argument("--trials", help="`metaltune trials --json` of the search, for its numbers")
    ap.add_argument("--runtime", default="{}",
                    help="the kept runtime settings (JSON, the search's kept.runtime): both sides run them")
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", help="write replay.json here")
    a = ap.parse_args()

    from kernelsearch import dispatch
    from kernelsearch.table import DispatchTable, TableError

    try:
        table = DispatchTable.load(a.table)
    except (TableError, OSError) as e:
        print(f"--table: {e}", file=sys.stderr)
        return 2
    from tuner.errors import BadInput

    try:
        wl = make(a.workload)
    except BadInput as e:
        print(e, file=sys.stderr)
        return 2
    try:
        wl.configure({**asdict(wl.runtime), **json.loads(a.runtime)})
    except ValueError as e:
        print(f"--runtime: {e}", file=sys.stderr)
        return 2
    from kernelsearch import libraries

    sides = {"plain": None, "kept table": table}
    found = [f.name for f in map(libraries.discover, libraries.LIBRARIES) if f.present]
    if found:  # an empty table: dispatch runs the best library kernel wherever one is offered
        sides[LIBRARY_ONLY] = DispatchTable([])
    samples: dict[str, list[dict[str, float]]] = {s: [] for s in sides}
    checks = {}
    t0 = time.time()
    for i in range(a.pairs):
        for side in (list(sides) if i % 2 == 0 else list(sides)[::-1]):
            dispatch.install(sides[side])
            wl.dispatch_changed()
            if side != "plain" and wl.check_outputs and side not in checks:
                checks[side] = wl.check()  # the workload's own output check against plain torch
            samples[side].append(per_size(wl, a.repeats))
    sizes = list(samples["plain"][0])
    med = {s: {k: statistics.median(m[k] for m in samples[s]) for k in sizes} for s in sides}
    rows = dict(med)
    if a.trials:
        rows.update(search_numbers(a.trials))
    print(f"{a.workload}: {len(table.entries)} table entries, runtime {a.runtime}, {a.pairs} ABBA "
          f"pairs x {a.repeats} repeats, {time.time() - t0:.0f} s; tokens/s per size (median)")
    print("| row | " + " | ".join(sizes) + " |")
    print("|---|" + "---|" * len(sizes))
    for name, vals in rows.items():
        print(f"| {name} | " + " | ".join(f"{vals[k]:.0f}" if k in vals else "-" for k in sizes) + " |")
    gain = {k: med["kept table"][k] / med["plain"][k] for k in sizes}
    print("| gain here (kept / plain) | " + " | ".join(f"{gain[k]:.2f}x" for k in sizes) + " |")
    vs_lib = {}
    if LIBRARY_ONLY in med:
        vs_lib = {k: med["kept table"][k] / med[LIBRARY_ONLY][k] for k in sizes}
        print("| kept / library only | " + " | ".join(f"{vs_lib[k]:.3f}x" for k in sizes) + " |")
    if a.trials and rows.get("search kept") and rows.get("search baseline"):
        sg = {k: rows["search kept"][k] / rows["search baseline"][k] for k in sizes
              if k in rows["search kept"] and k in rows["search baseline"]}
        print("| gain in the search | " + " | ".join(f"{sg[k]:.2f}x" if k in sg else "-" for k in sizes) + " |")
    print("output check:", json.dumps(checks, default=str))
    print("libraries found:", ", ".join(found) or "none")
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "replay.json").write_text(json.dumps(
            {"workload": a.workload, "table": a.table, "samples": samples, "medians": rows,
             "gain": gain, "kept_vs_library_only": vs_lib, "libraries": found,
             "check": checks.get("kept table"), "checks": checks}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
