"""MLA decode round 3 (issue 45) on the H200: where users run DeepSeek-V3/V3.2, not FlashMLA's
128-head sweet spot. Every case of heads 16/32/64/128 (tensor parallel 8/4/2/1) x query tokens
1 and 2 (multi-token prediction; dense only) x contexts 4k..128k x full and ragged batches
(a length drawn per request), for dense bf16, sparse bf16 (V3.2, top-2048) and sparse FP8
(V3.2's 656-byte row): the project's kernels (a small config grid per variant) against FlashMLA
(dense, sparse bf16, FP8; its sparse kernels take 64 or 128 heads, so fewer heads are padded
with zero heads, as vLLM does), every output checked against the family's float64 reference,
times inside CUDA graphs, and each against the memory floor: the bytes the call must read
(the batch's own lengths) at the H200's measured read bandwidth
(benchmarks/results/h200-ceilings-2026-11-29.json, read_sum_TBps).

  GPU:  python3 benchmarks/bench_mla_round3.py --out DIR --deadline-s 420
  CPU:  python benchmarks/bench_mla_round3.py --dry-run [--json]   (the case list and floors)

Cases run in order of the issue's targets (16 and 32 heads first); at the deadline the rest
are written as skipped, and the JSON is saved after every case."""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CEILINGS = ROOT / "benchmarks" / "results" / "h200-ceilings-2026-11-29.json"
HEADS = (16, 32, 64, 128)
SQS = (1, 2)
KINDS = ("dense", "sparse", "fp8")
# (batch, context): decode batches a serving engine runs at each context
POINTS = ((128, 4096), (64, 16384), (32, 32768), (8, 131072))
RAGGED = ((64, 32768),)  # lengths drawn per request, the longest at the context
PAGE = 64
TOPK = 2048
# bf16 dense FLOP/s measured on the H200 (benchmarks/bench_mla.py's PEAK, from
# h200-anchors-2026-12-01.json): where FLOPs take longer than the bytes, a case is compute-bound
PEAK = 735e12
FLASHMLA_SPARSE_HEADS = (64, 128)
# the config grid timed per variant (a subset of each variant's space)
GRID = {"BLOCK_N": (32, 64), "STAGES": (2,), "GRID": (132, 264, 528), "num_warps": (4, 8)}
PROJECT = {"mla_decode": ("fitted", "splitkv", "tma", "gluon_wgmma", "gluon_pingpong"),
           "mla_decode_mtp": ("fitted", "splitkv"),
           "mla_sparse_decode": ("rows", "splitkv", "gluon_wgmma", "gluon_pingpong"),
           "mla_sparse_decode_fp8": ("fitted", "rows")}


@dataclass(frozen=True)
class Case:
    kind: str  # dense | sparse | fp8
    B: int
    H: int
    L: int
    sq: int
    ragged: int

    @property
    def family(self) -> str:
        if self.kind == "dense":
            return "mla_decode" if self.sq == 1 else "mla_decode_mtp"
        return "mla_sparse_decode" if self.kind == "sparse" else "mla_sparse_decode_fp8"

    @property
    def shape(self) -> tuple:
        if self.family == "mla_decode":
            return (self.B, self.H, self.L, PAGE, self.ragged)
        if self.family == "mla_decode_mtp":
            return (self.B, self.H, self.L, PAGE, self.sq, self.ragged)
        return (self.B, self.H, self.L, PAGE, TOPK, self.ragged)

    @property
    def label(self) -> str:
        ctx = f"{self.L // 1024}k"
        return (f"{self.kind} {self.H}h sq{self.sq} {self.B}x{ctx}"
                + (" ragged" if self.ragged else ""))


def cases(kinds=KINDS, heads=HEADS, sqs=SQS, points=POINTS, ragged=RAGGED) -> list[Case]:
    """Every case, in the order they run: heads ascending (the memory-bound targets first),
    then kind, query tokens, points, the ragged batch last."""
    out = []
    for h in heads:
        for kind in kinds:
            for sq in sqs:
                if kind != "dense" and sq != 1:
                    continue  # V3.2 decodes one query token (the sparse families' form)
                out += [Case(kind, b, h, n, sq, 0) for b, n in points]
                out += [Case(kind, b, h, n, sq, 1) for b, n in ragged]
    return out


def read_tbps(path: Path = CEILINGS) -> float:
    rec = json.loads(path.read_text())
    return float(rec.get("ceilings", rec)["read_sum_TBps"])


def row_bytes(case: Case) -> int:
    return 656 if case.kind == "fp8" else 576 * 2


def floor_bytes(case: Case, tokens: Optional[float] = None) -> float:
    """Bytes a call must move: the cache rows it attends (each read once, for every query row
    of its sequence), q in and the output out (bf16), the lengths (and indices). `tokens`:
    the rows the batch attends (its own lengths); None: the full batch (every sequence at L)."""
    per_seq = min(TOPK, case.L) if case.kind != "dense" else case.L
    n = case.B * per_seq if tokens is None else tokens
    rows = case.B * case.sq * case.H
    ints = case.B * 4 + (case.B * TOPK * 4 if case.kind != "dense" else 0)
    return n * row_bytes(case) + rows * (576 + 512) * 2 + ints


def floor_us(case: Case, tbps: float, tokens: Optional[float] = None) -> float:
    return floor_bytes(case, tokens) / (tbps * 1e12) * 1e6


def compute_us(case: Case, tokens: Optional[float] = None) -> float:
    """FLOPs at PEAK: q.k over 576 and p.v over 512 columns, every query row, every row read."""
    per_seq = min(TOPK, case.L) if case.kind != "dense" else case.L
    n = case.B * per_seq if tokens is None else tokens
    return 2.0 * case.sq * case.H * n * (576 + 512) / PEAK * 1e6


def plan(args) -> dict:
    tbps = read_tbps(Path(args.ceilings))
    cs = cases(args.kinds, args.heads, args.sq, args.points, args.ragged)
    return {"read_TBps": tbps, "ceilings": str(args.ceilings), "deadline_s": args.deadline_s,
            "cases": [dict(asdict(c), label=c.label, family=c.family, shape=list(c.shape),
                           floor_us_full=None if c.ragged else floor_us(c, tbps),
                           compute_us_full=None if c.ragged else compute_us(c),
                           bound=None if c.ragged else (
                               "memory" if floor_us(c, tbps) >= compute_us(c) else "compute"))
                      for c in cs]}


# -- the GPU part ------------------------------------------------------------------------------


def log(*a):
    print(*a, flush=True)


def attended_tokens(case: Case, args) -> float:
    """Rows the batch really attends: its own lengths (dense), its valid indices (sparse)."""
    lens = args[3].long().clamp_min(0)
    if case.kind == "dense":
        return float(lens.sum())
    idx = args[4]
    return float(((idx >= 0) & (idx < lens[:, None])).sum())


def project_configs(fam, variant: str, shape, per_variant: int) -> list[dict]:
    """Configs to time: GRID's subset of the variant's space at this shape; the largest head
    block up to 64 rows (16 heads x 2 tokens: 32, one tile for the step) on 4 warps (8 for 64
    rows); spread over tile length (64 first) and programs (132 first)."""
    var = fam.variants.get(variant)
    if var is None:
        return []
    cfgs = [c for c in var.configs(shape) if all(c[k] in v for k, v in GRID.items() if k in c)]
    blocks = [c["BLOCK_H"] for c in cfgs if c.get("BLOCK_H", 128) <= 64]
    if blocks:
        bh = max(blocks)
        cfgs = [c for c in cfgs if c["BLOCK_H"] == bh
                and c.get("num_warps", 4) == (4 if bh <= 32 else 8)]
    cfgs.sort(key=lambda c: (-c.get("BLOCK_N", 0), c.get("GRID", 0)))
    return cfgs[:per_variant]


def offered(fam, variant: str) -> bool:
    var = fam.variants.get(variant)
    if var is None or var.kind == "library":
        return False
    if var.gpu_only:
        from kernelsearch.families import gluon

        return gluon.available()
    return True


def load_variant(fam, variant: str):
    import importlib.util

    var = fam.variants[variant]
    spec = importlib.util.spec_from_file_location(f"round3_{fam.name}_{variant}", var.file)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.forward


def flashmla_impls(case: Case, sets: list) -> list[tuple[str, Any, list]]:
    """(name, fn, prepared sets) for FlashMLA at this case; inputs converted outside the
    timed call (views for dense; physical rows, padded heads for sparse)."""
    import torch

    from kernelsearch import libraries
    from kernelsearch.families import flashmla_layouts as lay

    fm = libraries.module("flash_mla")
    B, H, sq = case.B, case.H, case.sq
    if case.kind == "dense":
        def dense(q4, kv4, bt, lens, scale):
            meta = fm.get_mla_metadata()[0]  # inside the call: lengths change every step
            return fm.flash_mla_with_kvcache(q4, kv4, bt, lens, 512, meta, None,
                                             softmax_scale=scale, causal=sq > 1)[0]
        pre = []
        for a in sets:
            q, kv, bt, lens, scale = a
            q4 = q.view(B, 1, H, 576) if sq == 1 else q
            pre.append((q4, kv.view(kv.shape[0], kv.shape[1], 1, 576), bt, lens, scale))
        shape_out = (B, H, 512) if sq == 1 else (B, sq, H, 512)
        return [("flashmla", lambda *a: dense(*a).reshape(shape_out), pre)]
    hp = H if H in FLASHMLA_SPARSE_HEADS else 64

    def pad(q):
        if hp == H:
            return q
        out = torch.zeros((B, hp, 576), dtype=q.dtype, device=q.device)
        out[:, :H] = q
        return out

    if case.kind == "sparse":
        pre = [(pad(q), kv.view(-1, 1, 576), lay.physical_rows(kv, bt, lens, idx), scale)
               for q, kv, bt, lens, idx, scale in sets]
        return [("flashmla_sparse_bf16",
                 lambda q, kv3, rows, scale: fm.flash_mla_sparse_fwd(q, kv3, rows, scale,
                                                                     512)[0][:, :H], pre)]

    def fp8(q4, c8, rows, scale):
        meta = fm.get_mla_metadata()[0]
        return fm.flash_mla_with_kvcache(q4, c8, None, None, 512, meta, None,
                                         softmax_scale=scale, causal=False,
                                         is_fp8_kvcache=True, indices=rows)[0].view(B, hp, 512)[:, :H]
    pre = [(pad(q).view(B, 1, hp, 576), kv.view(kv.shape[0], kv.shape[1], 1, kv.shape[2]),
            lay.physical_rows(kv, bt, lens, idx), scale) for q, kv, bt, lens, idx, scale in sets]
    return [("flashmla_sparse_fp8", fp8, pre)]


def measure(name: str, fn, sets, ref, fam, floor: float, extra: dict) -> dict:
    import torch

    from kernelsearch.harness import timing as tm
    from kernelsearch.harness.correctness import compare
    from kernelsearch.harness.verdict import Rejected

    r: dict = dict(extra)
    try:
        compare(fn(*sets[0]), ref, "bfloat16", fam, name)
        r["check"] = "ok"
        r["us"] = tm.bench_graph(fn, sets, replays=10)["median_s"] * 1e6
        r["pct_floor"] = 100.0 * floor / r["us"]
    except Rejected as e:
        r["check"] = "FAILED: " + e.detail[:300]
    except torch.cuda.OutOfMemoryError as e:
        r["error"] = f"out of memory: {str(e)[:160]}"
    except Exception as e:  # noqa: BLE001  (a kernel refusing a shape is a result)
        r["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    torch.cuda.empty_cache()
    return r


def run_case(case: Case, tbps: float, per_variant: int, stop_at: float) -> dict:
    import torch

    from kernelsearch.families import get

    fam = get(case.family)
    t0 = time.time()
    sets = [fam.make_inputs(case.shape, "bfloat16", "cuda",
                            torch.Generator().manual_seed(100 + i), "normal") for i in range(2)]
    ref = fam.reference(*sets[0])
    toks = attended_tokens(case, sets[0])
    floor = floor_us(case, tbps, toks)
    row: dict = {"case": case.label, "shape": list(case.shape), "family": case.family,
                 "tokens": toks, "floor_us": floor, "compute_us": compute_us(case, toks),
                 "impls": {}}
    row["bound"] = "memory" if floor >= row["compute_us"] else "compute"
    for variant in PROJECT[case.family]:
        if not offered(fam, variant):
            continue
        fwd = load_variant(fam, variant)
        for cfg in project_configs(fam, variant, case.shape, per_variant):
            if time.time() > stop_at:
                row["cut"] = "deadline"
                break
            key = f"{variant} {json.dumps(cfg, sort_keys=True)}"
            row["impls"][key] = measure(key, lambda *a, f=fwd, c=cfg: f(*a, **c), sets, ref,
                                        fam, floor, {"project": True})
    try:
        for name, fn, pre in flashmla_impls(case, sets):
            row["impls"][name] = measure(name, fn, pre, ref, fam, floor,
                                         {"project": False, "padded_heads": case.kind != "dense"
                                          and case.H not in FLASHMLA_SPARSE_HEADS})
    except Exception as e:  # noqa: BLE001  (FlashMLA not built or not importable here)
        row["flashmla"] = f"not available: {type(e).__name__}: {str(e)[:200]}"
    summarise(row)
    row["seconds"] = round(time.time() - t0, 1)
    del sets, ref
    torch.cuda.empty_cache()
    return row


def summarise(row: dict) -> None:
    ok = {k: r for k, r in row["impls"].items() if r.get("check") == "ok" and "us" in r}
    mine = {k: r for k, r in ok.items() if r["project"]}
    lib = {k: r for k, r in ok.items() if not r["project"]}
    if mine:
        k = min(mine, key=lambda k: mine[k]["us"])
        row.update(best_project=k, project_us=mine[k]["us"], project_pct=mine[k]["pct_floor"])
    if lib:
        k = min(lib, key=lambda k: lib[k]["us"])
        row.update(best_library=k, library_us=lib[k]["us"], library_pct=lib[k]["pct_floor"])
    if mine and lib:
        row["x_library"] = row["library_us"] / row["project_us"]  # > 1: the project is ahead


def table_md(rows: list[dict]) -> str:
    lines = ["| case | bound | floor us | best project | us | % floor | best library | us "
             "| % floor | x library |", "|" + " --- |" * 10]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['case']} | | | skipped: {r['skipped']} | | | | | | |")
            continue

        def cell(k):
            v = r.get(k)
            return "" if v is None else (f"{v:.1f}" if isinstance(v, float) else str(v))
        lines.append(f"| {r['case']} | {r.get('bound', '')} | {cell('floor_us')} | "
                     f"{r.get('best_project', '-')} | "
                     f"{cell('project_us')} | {cell('project_pct')} | "
                     f"{r.get('best_library', r.get('flashmla', '-'))} | {cell('library_us')} | "
                     f"{cell('library_pct')} | {cell('x_library')} |")
    return "\n".join(lines)


def run(args, p: dict) -> int:
    import torch

    if not torch.cuda.is_available():
        print("bench_mla_round3: needs a CUDA GPU (--dry-run prints the plan here)",
              file=sys.stderr)
        return 2
    from kernelsearch.runtime import ensure_scratch_allocator

    ensure_scratch_allocator()
    t0 = time.time()
    stop_at = t0 + args.deadline_s
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rec = {k: v for k, v in p.items() if k != "cases"}
    rec.update(device=torch.cuda.get_device_name(), rows=[])
    for c in cases(args.kinds, args.heads, args.sq, args.points, args.ragged):
        if time.time() > stop_at:
            rec["rows"].append({"case": c.label, "skipped": "deadline"})
            continue
        log(f"[round3] {c.label} at {time.time() - t0:.0f}s")
        try:
            row = run_case(c, p["read_TBps"], args.configs_per_variant, stop_at)
        except torch.cuda.OutOfMemoryError as e:
            row = {"case": c.label, "skipped": f"out of memory: {str(e)[:120]}"}
            torch.cuda.empty_cache()
        rec["rows"].append(row)
        log(f"  project {row.get('project_us', float('nan')):.1f} us "
            f"({row.get('project_pct', float('nan')):.0f}% floor), library "
            f"{row.get('library_us', float('nan')):.1f} us, x {row.get('x_library', 0):.2f}")
        (out / "mla_round3.json").write_text(json.dumps(rec, indent=1))
    rec["seconds"] = round(time.time() - t0, 1)
    (out / "mla_round3.json").write_text(json.dumps(rec, indent=1))
    md = table_md(rec["rows"])
    (out / "mla_round3.md").write_text(md + "\n")
    print(md)
    return 0


def _ints(s: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in s.split(",") if x)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}")
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {s!r}")
    return vals


def _points(s: str) -> tuple[tuple[int, int], ...]:
    if s == "":
        return ()
    out = []
    for part in s.split(","):
        b, x, n = part.partition("x")
        if not (x and b.isdigit() and n.isdigit() and int(b) > 0 and int(n) > 0):
            raise argparse.ArgumentTypeError(f"expected BxCONTEXT[,BxCONTEXT..] (e.g. 8x131072), "
                                             f"got {part!r}")
        out.append((int(b), int(n)))
    return tuple(out)


def _kinds(s: str) -> tuple[str, ...]:
    ks = tuple(x for x in s.split(",") if x)
    bad = [k for k in ks if k not in KINDS]
    if bad or not ks:
        raise argparse.ArgumentTypeError(f"expected some of {','.join(KINDS)}, got {s!r}")
    return ks


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="", help="results folder (mla_round3.json, .md)")
    ap.add_argument("--deadline-s", type=float, default=420.0,
                    help="stop starting cases after this many seconds (the rest: skipped)")
    ap.add_argument("--kinds", type=_kinds, default=KINDS)
    ap.add_argument("--heads", type=_ints, default=HEADS)
    ap.add_argument("--sq", type=_ints, default=SQS)
    ap.add_argument("--points", type=_points, default=POINTS, help="BxCONTEXT,...")
    ap.add_argument("--ragged", type=_points, default=RAGGED, help="BxCONTEXT,... ('' none)")
    ap.add_argument("--configs-per-variant", type=int, default=6)
    ap.add_argument("--ceilings", default=str(CEILINGS))
    ap.add_argument("--dry-run", action="store_true", help="print the plan (no GPU needed)")
    ap.add_argument("--json", action="store_true", help="--dry-run: the plan as JSON")
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if any(s not in SQS for s in args.sq):
        print(f"bench_mla_round3: --sq takes 1 and/or 2, got {args.sq}", file=sys.stderr)
        return 2
    try:
        p = plan(args)
    except (OSError, ValueError, KeyError) as e:
        print(f"bench_mla_round3: --ceilings {args.ceilings}: expected a JSON file with "
              f"read_sum_TBps ({type(e).__name__}: {e})", file=sys.stderr)
        return 2
    if args.dry_run:
        if args.json:
            print(json.dumps(p, indent=1))
        else:
            for c in p["cases"]:
                f = c["floor_us_full"]
                print(f"{c['label']:<34} {c['family']:<22} "
                      + (f"floor {f:9.1f} us  compute {c['compute_us_full']:9.1f} us  "
                         f"{c['bound']}-bound" if f is not None else "floor from its lengths"))
            print(f"{len(p['cases'])} cases; memory floor at {p['read_TBps']:.3f} TB/s")
        return 0
    if not args.out:
        print("bench_mla_round3: --out DIR is needed to run (or --dry-run)", file=sys.stderr)
        return 2
    return run(args, p)


if __name__ == "__main__":
    sys.exit(main())
