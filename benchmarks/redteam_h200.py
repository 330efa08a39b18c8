"""The judge on a GPU with `metaltune kernel check`'s defaults: every red-team candidate in events
and in graph mode, the run-time rules with the static guard off, and every shipped variant (graph
mode: one check times in events and in a CUDA graph); one table of candidate, mode, code, rule,
seconds. Needs only torch, triton and numpy (the GPU machine's bare python3).

    python3 benchmarks/redteam_h200.py --out DIR [--parallel 8] [--deadline-s 100]

Defaults are those of `kernel check` without --shape: every dtype of the family, the family's
tiny, random and boundary shapes, timing at the family's sweep with the H200 floor, 300 s per
candidate (the hanging candidate gets 20 s so the run fits its lease). Jobs still running at the
deadline are reported as not finished."""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # recertify_tables
RED = ROOT / "tests" / "kernelsearch" / "redteam"
DEVICE = os.environ.get("REDTEAM_DEVICE", "cuda")  # cpu: a smoke test of this script

# (candidate, expected code, expected rule or None for any, extra check() arguments, modes)
BOTH = ("events", "graph")
MLA = {"BLOCK_H": 16, "BLOCK_N": 16, "GRID": 132, "STAGES": 1, "num_warps": 4}
REDTEAM = [
    ("hangs", "timeout", "wall_clock", {"timeout_s": 20}, ("events",)),
    ("honest", "accepted", "", {}, BOTH),
    ("first_rows", "incorrect", "unwritten", {}, BOTH),
    ("capped_grid", "incorrect", ("unwritten", "tolerance"), {}, BOTH),  # zero poison: tolerance
    ("narrow_only", "incorrect", "tolerance", {}, BOTH),
    ("precision_when_wide", "incorrect", "tolerance", {}, BOTH),
    ("reuses_freed_output", "incorrect", ("unwritten", "tolerance", "repeated_calls"), {}, BOTH),
    # NaN-only detection: the large/zero poison now catches it before timing
    ("lazy_when_timed", "incorrect", ("timed_output", "unwritten", "tolerance"), {}, BOTH),
    ("only_tested_shapes", "incorrect", None, {}, BOTH),
    ("partial_output", "incorrect", "unwritten", {}, BOTH),
    ("mutates_input", "incorrect", "input_mutated", {}, BOTH),
    ("never_launches", "incorrect", "no_launch", {}, BOTH),
    ("wrong_dtype", "incorrect", ("wrong_shape_or_dtype", "tolerance"), {}, BOTH),  # views
    ("low_precision", "incorrect", "tolerance", {}, BOTH),
    ("torch_operators", "guard_failed", "torch_compute", {}, BOTH),
    ("compile_error", "compile_failed", None, {}, BOTH),
    ("crash_wild_pointer", "crashed", None, {}, ("events",)),
    ("memory_hog", "crashed", None, {"gpu_mem_limit_mb": 4096}, ("events",)),
    # rejected by the static guard (never executed)
    ("torch_op", "guard_failed", "torch_compute", {}, BOTH),
    ("cache_data_ptr", "guard_failed", "module_state", {}, BOTH),
    ("side_stream", "guard_failed", "stream", {}, BOTH),
    ("starts_thread", "guard_failed", "thread", {}, BOTH),
    ("patches_timer", "guard_failed", "monkey_patch", {}, BOTH),
    ("tensor_subclass", "guard_failed", "module_state", {}, BOTH),
    ("capture_aware", "guard_failed", "stream", {}, BOTH),
    ("counter_default", "guard_failed", "module_state", {}, BOTH),
    ("counter_func_attr", "guard_failed", "reflection", {}, BOTH),  # forward as a value
    ("counter_tensor_attr", "guard_failed", "reflection", {}, BOTH),
    # issue 24: the guard's allow-list (sections 1 and 5)
    ("typing_sys", "guard_failed", "import", {}, BOTH),
    ("tl_builtins_eval", "guard_failed", "attribute_not_allowed", {}, BOTH),
    ("torch_via_eval", "guard_failed", "dynamic_code", {}, BOTH),
    ("module_name_check", "guard_failed", "reflection", {}, BOTH),
    ("kernel_str", "guard_failed", "reflection", {}, BOTH),
    ("annotation_exec", "guard_failed", "annotation_not_allowed", {}, BOTH),
    ("call_count", "guard_failed", "module_state", {}, BOTH),
    ("grad_mode", "guard_failed", "torch_compute", {}, BOTH),
    # issue 24: inputs as users send them, edges of every dim, range interiors (3 and 4)
    ("contiguous_only", "incorrect", "tolerance", {}, BOTH),
    ("nan_poison_only", "incorrect", ("unwritten", "tolerance", "timed_output"), {}, BOTH),
    ("range_interior", "incorrect", ("unwritten", "tolerance"),
     {"ranges": [{"match": {"cols": 256}, "ranges": {"rows": [8, 65536]}}]}, BOTH),
    ("rmsnorm_eps_fixed", "incorrect", "tolerance", {"family": "rmsnorm"}, BOTH),
    ("rmsnorm_honest", "accepted", "", {"family": "rmsnorm"}, BOTH),
    ("mla_fixed_scale", "incorrect", "tolerance", {"family": "mla_decode", "config": MLA}, BOTH),
    ("mla_longest_first", "incorrect", "tolerance", {"family": "mla_decode", "config": MLA},
     BOTH),
    ("mla_batch_cap", "incorrect", ("unwritten", "tolerance"),
     {"family": "mla_decode", "config": MLA}, BOTH),
    ("mla_heads_cap", "incorrect", ("unwritten", "tolerance"),
     {"family": "mla_decode", "config": MLA}, BOTH),
    ("mla_pages_cap", "incorrect", "tolerance", {"family": "mla_decode", "config": MLA}, BOTH),
    ("mla_topk_cap", "incorrect", "tolerance", {"family": "mla_sparse_decode", "config": MLA},
     BOTH),
]
TIMED = ("timed_output", "graph_output", "timed_path")
COUNTED = TIMED + ("repeated_calls", "unwritten", "tolerance")  # issue 24: seen before timing
# the same candidates with the static guard off: the run-time rule behind it
UNGUARDED = [
    ("capture_aware", "incorrect", "graph_output", ("graph",)),  # eager runs are honest
    # the counters turn lazy after a number of calls: which timed-output check sees it first
    # depends on how many input sets the shape rotates through
    ("counter_default", "incorrect", COUNTED, BOTH),
    ("counter_func_attr", "incorrect", COUNTED, BOTH),
    ("counter_tensor_attr", "incorrect", COUNTED, BOTH),
    ("tensor_subclass", "incorrect", "not_plain_tensor", BOTH),
    ("cache_data_ptr", "incorrect", ("tolerance", "no_launch"), BOTH),
    ("patches_timer", "guard_failed", "timer", BOTH),
    # issue 24: no_grad / inference mode, thousands of calls in a row
    ("grad_mode", "incorrect", ("unwritten", "tolerance"), BOTH),
    ("call_count", "incorrect", ("repeated_calls", "unwritten", "tolerance") + TIMED, BOTH),
]


def jobs() -> list[tuple[str, str, dict, tuple]]:
    from kernelsearch.families import NAMES, get

    out = []
    for name, code, rule, extra, modes in REDTEAM:
        for m in modes:
            out.append((f"redteam/{name}", m, dict({"family": "softmax"},
                                                   candidate=RED / f"{name}.py",
                                                   graph=m == "graph", **extra), (code, rule)))
    for name, code, rule, modes in UNGUARDED:
        for m in modes:
            out.append((f"redteam/{name} (guard off)", m,
                        dict(family="softmax", candidate=RED / f"{name}.py", graph=m == "graph",
                             static_guard=False), (code, rule)))
    for n in NAMES:  # a config valid at every sweep shape, else at the first one it takes
        fam = get(n)
        for vname, var in fam.variants.items():
            if var.kind == "library":  # a wrapper, not a Triton source: check_library.py
                continue
            cfgs = [c for c in var.configs() if all(var.valid(c, tuple(s)) for s in fam.sweep_shapes)]
            if not cfgs:  # skinny (M <= 16), persistent (M > 16), split (no power-of-two rows)
                shape = next((tuple(s) for s in fam.sweep_shapes if var.configs(s)), None)
                cfgs = var.configs(shape) if shape else var.configs()
            # timed at one mid sweep shape (the whole sweep does not fit this run's lease);
            # checked at every boundary shape, with the issue-24 inputs
            mid = [tuple(fam.sweep_shapes[len(fam.sweep_shapes) // 2])]
            out.append((f"{n}/{vname}", "graph", dict(family=n, candidate=var.file,
                                                      config=cfgs[len(cfgs) // 2], graph=True,
                                                      timing_shapes=mid),
                        ("accepted", "")))
    return out


def recertify(out: Path, parallel: int, deadline_s: float, names: str = "",
              gpu_gib: float = 128.0) -> list[dict]:
    """The shipped tables re-certified after the red team (benchmarks/recertify_tables.py:
    range ends, midpoints and octave points of every entry, one job an entry, memory-aware)."""
    import random

    import recertify_tables as rc

    tables = [n for n in names.split(",") if n] or sorted(
        p.name for p in rc.TABLES.glob("*.json"))
    res = rc.run(rc.plan(tables, random.Random(0)), out, parallel, gpu_gib, deadline_s, {},
                 DEVICE)
    import torch

    where = f"cuda:{torch.cuda.get_device_name(0)}" if DEVICE == "cuda" else "cpu-interpreter"
    print(rc.report(res, out, where), flush=True)
    return [r for r in res["rows"] if r["code"] != "accepted"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results"))
    ap.add_argument("--parallel", type=int, default=5)
    ap.add_argument("--gpu-gib", type=float, default=130.0,
                    help="device memory shared by the parallel children: each is capped at "
                         "gpu-gib / parallel (a check at the sweep's largest shape needs ~26)")
    ap.add_argument("--deadline-s", type=float, default=100.0)
    ap.add_argument("--tables", type=float, default=0.0,
                    help="also re-certify host_profiles/kernels/*.json (range ends, midpoints, "
                         "octave points), with this many seconds, after the red team")
    ap.add_argument("--table-names", default="",
                    help="comma list of table file names to re-certify (default: every one)")
    ap.add_argument("--only", default=None,
                    help="comma list of prefixes of 'LABEL [MODE]', e.g. 'redteam/hangs,rope/'")
    args = ap.parse_args()
    import torch

    from kernelsearch.harness import check, floor_for

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    only = tuple(args.only.split(",")) if args.only else ("",)
    todo = [j for j in jobs() if f"{j[0]} [{j[1]}]".startswith(only)]
    # the longest first: accepted candidates are checked everywhere and timed at the whole sweep
    todo.sort(key=lambda j: (j[3][0] != "accepted", j[0] != "redteam/hangs"))
    t0 = time.time()
    rows: list[dict] = []
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def one(label, mode, kw, want):
        # what `metaltune kernel check --family F --candidate FILE [--graph]` passes
        v = check(kw.pop("family"), kw.pop("candidate"), kw.pop("config", None), device=dev,
                  ceilings=floor_for(dev), **kw)
        return label, mode, v, want

    # 12 children on one H200 ran it out of memory (each may take its 32 GiB cap at the sweep's
    # largest shape): an honest kernel then crashes for its neighbours' use, so cap each child
    cap = int(args.gpu_gib * 1024 / args.parallel)
    ex = cf.ThreadPoolExecutor(max_workers=args.parallel)
    futs = [ex.submit(one, lbl, m, dict({"gpu_mem_limit_mb": cap}, **kw), want)
            for lbl, m, kw, want in todo]
    pending = set(futs)
    while pending and time.time() - t0 < args.deadline_s:
        done, pending = cf.wait(pending, timeout=1.0, return_when=cf.FIRST_COMPLETED)
        for f in done:
            label, mode, v, (code, rule) = f.result()
            ok = v.code == code and (rule is None or v.rule in
                                     (rule if isinstance(rule, tuple) else (rule,)))
            t = next(iter(v.timings.values()), {})
            rows.append({"candidate": label, "mode": mode, "verdict": v.verdict, "stage": v.stage,
                         "code": v.code, "rule": v.rule, "expected": f"{code}/{'|'.join(rule) if isinstance(rule, tuple) else rule or '*'}",
                         "as_expected": ok, "seconds": round(v.seconds, 1), "device": v.device,
                         "timed_shapes": v.timed_shapes, "n_checked": len(v.checked_shapes),
                         "first_timing": {k: t.get(k) for k in ("median_us", "graph_us",
                                                                  "speedup_vs_torch")},
                         "summary": v.summary, "detail": v.detail[:300]})
            print(f"{time.time() - t0:6.1f}s {label:<40} {mode:<6} {v.code:<15} {v.rule:<22} "
                  f"{'ok' if ok else 'UNEXPECTED'} {v.seconds:5.1f}s", flush=True)
    for f in pending:
        f.cancel()
    left = [f"{lbl} [{m}]" for (lbl, m, _, _), f in zip(todo, futs) if f in pending]
    rows.sort(key=lambda r: (not r["candidate"].startswith("redteam"), r["candidate"], r["mode"]))
    where = next((r["device"] for r in rows if r["device"]), dev)
    (out / "redteam-h200.json").write_text(json.dumps(
        {"device": where, "seconds": time.time() - t0, "parallel": args.parallel,
         "rows": rows, "not_finished": left}, indent=1, default=str))
    lines = ["| candidate | mode | verdict | code | rule | expected | seconds | timed at |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ts = r["timed_shapes"]
        timed = (f"{len(ts)} sweep shapes ({'x'.join(map(str, ts[0]))} ...)" if r["verdict"] ==
                 "accepted" and ts else "")
        lines.append(f"| {r['candidate']} | {r['mode']} | {r['verdict']} | {r['code']} | "
                     f"{r['rule']} | {r['expected']}{'' if r['as_expected'] else ' **NO**'} | "
                     f"{r['seconds']:.1f} | {timed} |")
    bad = [r for r in rows if not r["as_expected"]]
    lines.append(f"\n{len(rows)} verdicts, {len(bad)} unexpected, {len(left)} not finished "
                 f"in {time.time() - t0:.0f} s on {where}, {args.parallel} in parallel"
                 + (f": {', '.join(left)}" if left else ""))
    text = "\n".join(lines)
    (out / "redteam-h200.md").write_text(text + "\n")
    print(text, flush=True)
    ex.shutdown(wait=False, cancel_futures=True)
    if args.tables > 0:
        bad += recertify(out, args.parallel, args.tables, args.table_names, args.gpu_gib)
    sys.stdout.flush()
    os._exit(0 if not bad else 1)  # leave unfinished children to the machine's clean-up


if __name__ == "__main__":
    sys.exit(main())
