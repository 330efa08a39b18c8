"""The MLA additions on the GPU: mla_decode_mtp (s_q = 2) and mla_sparse_decode_fp8 (V3.2 FP8
cache) Triton variants checked against their float64 references (bf16 tolerance) and timed in
CUDA graphs at the bench_mla shapes, against the torch path and the roofline floor
max(bytes / 4.3 TB/s, FLOPs / 735 TFLOP/s); the torch path on FlashMLA's test inputs (NaN in
unread rows, 2147480000 in unused block-table slots, zero-length sequences) on the GPU; and a
probe of the Gluon API of the installed Triton (whether it runs under TRITON_INTERPRET=1).

    python3 benchmarks/bench_mla_new_families.py --out DIR [--parts probe,families,torch]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PEAK, BW = 735e12, 4.3e12
SHAPES = {"mla_decode_mtp": [(64, 128, 4096, 64, 2, 0), (32, 128, 32768, 64, 2, 0),
                             (8, 128, 131072, 64, 2, 0), (128, 128, 163840, 64, 2, 0)],
          "mla_sparse_decode_fp8": [(64, 128, 4096, 64, 2048, 0), (32, 128, 32768, 64, 2048, 0),
                                    (8, 128, 131072, 64, 2048, 0),
                                    (128, 128, 163840, 64, 2048, 0)]}
CONFIGS = {"mla_decode_mtp": [dict(BLOCK_H=64, BLOCK_N=64, GRID=264, STAGES=2, num_warps=8),
                              dict(BLOCK_H=64, BLOCK_N=32, GRID=528, STAGES=3, num_warps=8)],
           "mla_sparse_decode_fp8": [dict(BLOCK_H=64, BLOCK_N=64, GRID=264, STAGES=2, num_warps=8),
                                     dict(BLOCK_H=64, BLOCK_N=32, GRID=528, STAGES=3,
                                          num_warps=8)]}
GLUON_INTERP = """
import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
@gluon.jit
def k(X, Y, N: gl.constexpr):
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    i = gl.arange(0, N, layout=layout)
    gl.store(Y + i, gl.load(X + i) * 2)
x = torch.arange(128, dtype=torch.float32); y = torch.empty_like(x)
k[(1,)](x, y, N=128, num_warps=4)
print("gluon under TRITON_INTERPRET=1 on CPU tensors:", torch.equal(y, 2 * x))
"""


def log(*a):
    print(*a, flush=True)


def probe(res):
    import triton
    import triton.experimental.gluon.language as gl
    import triton.experimental.gluon.language.nvidia.hopper as h
    from triton.experimental.gluon.language.nvidia.ampere import async_copy

    res["probe"] = {"triton": triton.__version__, "hopper": [n for n in dir(h) if not n.startswith("_")],
                    "hopper.tma": [n for n in dir(h.tma) if not n.startswith("_")],
                    "hopper.mbarrier": [n for n in dir(h.mbarrier) if not n.startswith("_")],
                    "ampere.async_copy": [n for n in dir(async_copy) if not n.startswith("_")],
                    "gl": [n for n in dir(gl) if not n.startswith("_")]}
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(GLUON_INTERP)  # triton reads a jit function's source from its file
    r = subprocess.run([sys.executable, f.name], capture_output=True, text=True,
                       env={**os.environ, "TRITON_INTERPRET": "1"}, timeout=120)
    res["probe"]["interpret"] = (r.stdout + r.stderr)[-600:]
    log(json.dumps(res["probe"])[:6000])


def families(res, budget_s, names, which=(0, 1, 2, 3)):
    import torch

    from kernelsearch.families import get
    from kernelsearch.harness import timing as tm
    from kernelsearch.harness.correctness import compare
    from kernelsearch.harness.sandbox import load

    t0 = time.time()
    rows = res.setdefault("families", [])  # kept as it grows: a later shape may run out of memory
    for name, shapes in SHAPES.items():
        if name not in names:
            continue
        fam = get(name)
        mods = {v: load(fam.variants[v].file.read_text(), "nf") for v in fam.variants}
        for shape in [shapes[i] for i in which]:
            if time.time() - t0 > budget_s:
                rows.append({"family": name, "shape": shape, "skipped": "budget"})
                continue
            g = torch.Generator().manual_seed(0)
            args = fam.make_inputs(shape, "bfloat16", "cuda", g)
            ref = fam.reference(*args)
            floor = max(fam.bytes_moved(shape, 2) / BW, fam.flops(shape) / PEAK)
            nset = tm.rotations(sum(a.numel() * a.element_size() for a in args
                                    if isinstance(a, torch.Tensor)), "cuda", cap=3)
            sets = [args] + [fam.make_inputs(shape, "bfloat16", "cuda",
                                             torch.Generator().manual_seed(i + 1))
                             for i in range(nset - 1)]
            row = {"family": name, "shape": shape, "floor_us": floor * 1e6, "impls": {}}
            for v, mod in mods.items():
                for cfg in CONFIGS[name]:
                    key = f"{v} {json.dumps(cfg, sort_keys=True)}"
                    try:
                        out = mod.forward(*args, **cfg)
                        compare(out, ref, "bfloat16", fam, f"{name} {shape}")
                        t = tm.bench_graph(lambda *a: mod.forward(*a, **cfg), sets,
                                           replays=10)["median_s"]
                        row["impls"][key] = {"us": t * 1e6, "pct_floor": 100 * floor / t}
                    except Exception as e:  # noqa: BLE001  (a measurement: record and go on)
                        row["impls"][key] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            try:
                t = tm.bench_graph(fam.torch_default, sets[:2], replays=5)["median_s"]
                row["impls"]["torch"] = {"us": t * 1e6, "pct_floor": 100 * floor / t}
            except Exception as e:  # noqa: BLE001
                row["impls"]["torch"] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
            log(json.dumps(row))
            rows.append(row)
            del sets, args, ref
            torch.cuda.empty_cache()


GLUON_SHAPES = [(64, 128, 4096, 64, 0), (32, 128, 32768, 64, 0), (8, 128, 131072, 64, 0),
                (128, 128, 163840, 64, 0)]
GLUON_CONFIGS = ([dict(BLOCK_N=64, STAGES=2, GRID=g, PIPE=1) for g in (132, 264, 528, 1056)]
                 + [dict(BLOCK_N=64, STAGES=2, GRID=g, PIPE=0) for g in (132, 528)]
                 + [dict(BLOCK_N=32, STAGES=4, GRID=g, PIPE=1) for g in (264, 528)])
# the shipped table's config for B 5-16 x L 32k-128k, and the FOCUSED grid's others
TRITON_BEST = ([("tma", dict(BLOCK_H=64, BLOCK_N=64, STAGES=2, WS=1, GRID=1056, num_warps=8))]
               + [("tma", dict(BLOCK_H=64, BLOCK_N=64, STAGES=2, WS=w, GRID=g, num_warps=8))
                  for w in (0, 1) for g in (264, 528)])


def gluon_dense(res, budget_s):
    """The Gluon mla_decode variant: correctness on ragged FlashMLA-style inputs (NaN in unread
    rows, pages 64 and 16), then the four bench shapes against the Triton tma variant."""
    import torch

    from kernelsearch.families import get, mla
    from kernelsearch.harness import timing as tm
    from kernelsearch.harness.correctness import compare
    from kernelsearch.harness.sandbox import load

    fam = get("mla_decode")
    gmod = load((ROOT / "kernelsearch/families/mla_decode/gluon_wgmma.py").read_text(), "gl")
    tmod = load(fam.variants["tma"].file.read_text(), "tm")
    out = {"checks": {}, "rows": []}
    import triton

    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                 device="cuda"))
    for shape in [(7, 128, 5000, 64, 1), (3, 128, 2049, 16, 1), (33, 128, 8193, 64, 1)]:
        args = fam.make_inputs(shape, "bfloat16", "cuda", torch.Generator().manual_seed(3))
        q, kv, bt, sl, sc = args
        flat = kv.view(-1, mla.D_QK)
        flat[(flat == mla.POISON).all(dim=1)] = float("nan")
        ref = fam.reference(*args)
        for cfg in (GLUON_CONFIGS[0], GLUON_CONFIGS[4], GLUON_CONFIGS[6]):
            k = f"{shape} {cfg}"
            try:
                compare(gmod.forward(*args, **cfg), ref, "bfloat16", fam, k)
                out["checks"][k] = "ok"
            except Exception as e:  # noqa: BLE001
                out["checks"][k] = f"{type(e).__name__}: {str(e)[:400]}"
            log(k, out["checks"][k])
    t0 = time.time()
    for shape in GLUON_SHAPES + [(16, 128, 131072, 64, 0)]:
        if time.time() - t0 > budget_s:
            break
        args = fam.make_inputs(shape, "bfloat16", "cuda", torch.Generator().manual_seed(0))
        ref = fam.reference(*args)
        sets = [args, fam.make_inputs(shape, "bfloat16", "cuda", torch.Generator().manual_seed(1))]
        floor = max(fam.bytes_moved(shape, 2) / BW, fam.flops(shape) / PEAK)
        row = {"shape": shape, "floor_us": floor * 1e6, "impls": {}}
        for name, mod, cfg in ([("gluon", gmod, c) for c in GLUON_CONFIGS]
                               + [(v, tmod, c) for v, c in TRITON_BEST]):
            k = f"{name} {json.dumps(cfg, sort_keys=True)}"
            try:
                compare(mod.forward(*args, **cfg), ref, "bfloat16", fam, k)
                t = tm.bench_graph(lambda *a: mod.forward(*a, **cfg), sets, replays=10)["median_s"]
                row["impls"][k] = {"us": t * 1e6, "pct_floor": 100 * floor / t}
            except Exception as e:  # noqa: BLE001
                row["impls"][k] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        log(json.dumps(row))
        out["rows"].append(row)
        del sets, args, ref
        torch.cuda.empty_cache()
    res["gluon"] = out


def gluon_sparse(res):
    """The Gluon mla_sparse_decode kernel: correctness on ragged inputs with NaN in unread rows
    and skipped slots, then the four bench shapes against the Triton rows variant."""
    import torch

    from kernelsearch.families import get, mla
    from kernelsearch.harness import timing as tm
    from kernelsearch.harness.correctness import compare
    from kernelsearch.harness.sandbox import load

    fam = get("mla_sparse_decode")
    gmod = load((ROOT / "kernelsearch/families/mla_sparse_decode/gluon_wgmma.py").read_text(),
                "gs")
    tmod = load(fam.variants["rows"].file.read_text(), "rs")
    out = {"checks": {}, "rows": []}
    cfgs = [dict(BLOCK_N=64, STAGES=2, GRID=g) for g in (132, 264, 528)] + [
        dict(BLOCK_N=32, STAGES=4, GRID=264)]
    for shape in [(7, 128, 5000, 64, 2048, 1), (3, 128, 1500, 16, 2048, 1),
                  (5, 128, 3000, 64, 512, 1)]:
        args = fam.make_inputs(shape, "bfloat16", "cuda", torch.Generator().manual_seed(3))
        flat = args[1].view(-1, mla.D_QK)
        flat[(flat == mla.POISON).all(dim=1)] = float("nan")
        ref = fam.reference(*args)
        for cfg in (cfgs[0], cfgs[3]):
            k = f"{shape} {cfg}"
            try:
                compare(gmod.forward(*args, **cfg), ref, "bfloat16", fam, k)
                out["checks"][k] = "ok"
            except Exception as e:  # noqa: BLE001
                out["checks"][k] = f"{type(e).__name__}: {str(e)[:400]}"
            log(k, out["checks"][k])
    for shape in SHAPES["mla_sparse_decode_fp8"]:
        args = fam.make_inputs(shape, "bfloat16", "cuda", torch.Generator().manual_seed(0))
        ref = fam.reference(*args)
        sets = [args] + [fam.make_inputs(shape, "bfloat16", "cuda",
                                         torch.Generator().manual_seed(i)) for i in (1, 2)]
        floor = max(fam.bytes_moved(shape, 2) / BW, fam.flops(shape) / PEAK)
        row = {"family": "mla_sparse_decode", "shape": shape, "floor_us": floor * 1e6,
               "impls": {}}
        for name, mod, cfg in ([("gluon", gmod, c) for c in cfgs]
                               + [("rows", tmod, dict(BLOCK_H=64, BLOCK_N=64, STAGES=2, GRID=g,
                                                      num_warps=8)) for g in (132, 264)]):
            k = f"{name} {json.dumps(cfg, sort_keys=True)}"
            try:
                compare(mod.forward(*args, **cfg), ref, "bfloat16", fam, k)
                t = tm.bench_graph(lambda *a: mod.forward(*a, **cfg), sets, replays=20)["median_s"]
                row["impls"][k] = {"us": t * 1e6, "pct_floor": 100 * floor / t}
            except Exception as e:  # noqa: BLE001
                row["impls"][k] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        log(json.dumps(row))
        out["rows"].append(row)
        del sets, args, ref
        torch.cuda.empty_cache()
    res["gluon_sparse"] = out


def gluon_probe(res):
    """Ceiling probe: the Gluon kernel's loop with no cache loads (MMAs, softmax, merge only;
    the output is wrong and not checked) against the full kernel, same config."""
    import torch

    from kernelsearch.families import get
    from kernelsearch.harness import timing as tm
    from kernelsearch.harness.sandbox import load

    fam = get("mla_decode")
    gmod = load((ROOT / "kernelsearch/families/mla_decode/gluon_wgmma.py").read_text(), "gp")
    rows = []
    for shape, grid in (((64, 128, 4096, 64, 0), 132), ((8, 128, 131072, 64, 0), 528)):
        args = fam.make_inputs(shape, "bfloat16", "cuda", torch.Generator().manual_seed(0))
        sets = [args, fam.make_inputs(shape, "bfloat16", "cuda", torch.Generator().manual_seed(1))]
        floor = max(fam.bytes_moved(shape, 2) / BW, fam.flops(shape) / PEAK)
        row = {"shape": shape, "floor_us": floor * 1e6}
        for nl in (0, 1):
            cfg = dict(BLOCK_N=64, STAGES=2, GRID=grid, PIPE=1, NOLOAD=nl)
            t = tm.bench_graph(lambda *a: gmod.forward(*a, **cfg), sets, replays=10)["median_s"]
            row[f"noload={nl}"] = {"us": t * 1e6, "pct_floor": 100 * floor / t}
        log(json.dumps(row))
        rows.append(row)
        del sets, args
        torch.cuda.empty_cache()
    res["gluon_probe"] = rows


SPARSE_CFGS = [(v, dict(BLOCK_H=64, BLOCK_N=bn, STAGES=st, GRID=g, num_warps=8))
               for v in ("rows", "splitkv") for bn, st in ((64, 2), (32, 3)) for g in (132, 264, 528)]


def sparse_table(res):
    """The sparse table cell B 5-16 x L 32k-160k: its entry (rows, 64/2, GRID 264) against the
    other configs at 8 x 128k and at the cell's end 16 x 160k."""
    import torch

    from kernelsearch.families import get
    from kernelsearch.harness import timing as tm
    from kernelsearch.harness.correctness import compare
    from kernelsearch.harness.sandbox import load

    fam = get("mla_sparse_decode")
    mods = {v: load(fam.variants[v].file.read_text(), "sp") for v in fam.variants}
    rows = []
    for shape in [(8, 128, 131072, 64, 2048, 0), (16, 128, 163840, 64, 2048, 0)]:
        args = fam.make_inputs(shape, "bfloat16", "cuda", torch.Generator().manual_seed(0))
        ref = fam.reference(*args)
        sets = [args] + [fam.make_inputs(shape, "bfloat16", "cuda",
                                         torch.Generator().manual_seed(i)) for i in (1, 2)]
        floor = max(fam.bytes_moved(shape, 2) / BW, fam.flops(shape) / PEAK)
        row = {"family": "mla_sparse_decode", "shape": shape, "floor_us": floor * 1e6,
               "impls": {}}
        for v, cfg in SPARSE_CFGS:
            k = f"{v} {json.dumps(cfg, sort_keys=True)}"
            try:
                compare(mods[v].forward(*args, **cfg), ref, "bfloat16", fam, k)
                t = tm.bench_graph(lambda *a: mods[v].forward(*a, **cfg), sets,
                                   replays=20)["median_s"]
                row["impls"][k] = {"us": t * 1e6, "pct_floor": 100 * floor / t}
            except Exception as e:  # noqa: BLE001
                row["impls"][k] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        log(json.dumps(row))
        rows.append(row)
        del sets, args
        torch.cuda.empty_cache()
    res["sparse_table"] = rows


def torch_path(res):
    """FlashMLA's inputs through the torch path on the GPU (bf16): NaN rows, unused slots,
    zero-length sequences; against the float64 reference."""
    import torch

    from kernelsearch.families import get, mla
    from kernelsearch.harness.correctness import compare

    fam = get("mla_decode")
    sp = get("mla_sparse_decode")
    out = {}
    g = torch.Generator().manual_seed(0)
    q, kv, bt, sl, _ = fam.make_inputs((8, 128, 4160, 64, 1), "bfloat16", "cuda", g)
    sl[2] = 0
    sl[3] = 0
    lens = sl.tolist()
    for b, n in enumerate(lens):
        bt[b, -(-n // 64):] = 2147480000
    flat = kv.view(-1, mla.D_QK)
    flat[(flat == mla.POISON).all(dim=1)] = float("nan")
    sc = mla.FLASHMLA_DEFAULT_SCALE
    o, lse = fam.torch_default(q, kv, bt, sl, sc, return_lse=True)
    ref, rl = fam.reference(q, kv, bt, sl, sc, return_lse=True)
    out["dense_rel_err"] = float((o.double() - ref).norm() / ref.norm())
    out["dense"] = {"nan": bool(o.isnan().any()), "zero_len_out_zero": bool((o[2:4] == 0).all()),
                    "lse_max_abs_err": float((lse.double() - rl)[torch.isfinite(rl)].abs().max())}
    idx = torch.randint(0, 4160, (8, 2048), generator=g, dtype=torch.int32).cuda()
    idx[1] = -1
    o, lse = sp.torch_default(q, kv, bt, sl, idx, sc, return_lse=True)
    ref = sp.reference(q, kv, bt, sl, idx, sc)
    out["sparse_rel_err"] = float((o.double() - ref).norm() / ref.norm())
    out["sparse"] = {"nan": bool(o.isnan().any()), "no_index_out_zero": bool((o[1] == 0).all())}
    res["torch_path"] = out
    log(json.dumps(out))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--parts", default="probe,torch,gluon,sparse,families")
    ap.add_argument("--families", default="mla_decode_mtp,mla_sparse_decode_fp8")
    ap.add_argument("--shapes", default="0,1,2,3", help="which of SHAPES' four, by index")
    ap.add_argument("--budget-s", type=float, default=200.0)
    a = ap.parse_args()
    import torch

    res = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    parts = a.parts.split(",")
    for p, fn in (("probe", lambda: probe(res)), ("torch", lambda: torch_path(res)),
                  ("gluon", lambda: gluon_dense(res, a.budget_s)),
                  ("sparse", lambda: sparse_table(res)),
                  ("gprobe", lambda: gluon_probe(res)),
                  ("gsparse", lambda: gluon_sparse(res)),
                  ("families", lambda: families(res, a.budget_s, a.families.split(","),
                                                [int(i) for i in a.shapes.split(",")]))):
        if p in parts:
            try:
                fn()
            except Exception as e:  # noqa: BLE001
                res[p + "_error"] = f"{type(e).__name__}: {str(e)[:500]}"
                log(res[p + "_error"])
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "mla_new_families.json").write_text(json.dumps(res, indent=1))
    for r in (res.get("families", []) + res.get("gluon", {}).get("rows", [])
              + res.get("sparse_table", []) + res.get("gluon_sparse", {}).get("rows", [])):
        best = {}
        for k, v in r.get("impls", {}).items():
            kind = k.split(" ")[0]
            if "us" in v and (kind not in best or v["us"] < best[kind][0]):
                best[kind] = (v["us"], k)
        cells = "; ".join(f"{kind} {us:.1f}us {100 * r['floor_us'] / us:.0f}%"
                          + (f" [{k[len(kind) + 1:]}]" if kind != "torch" else "")
                          for kind, (us, k) in sorted(best.items()))
        log(f"{r.get('family', 'mla_decode')} {r['shape']} floor {r['floor_us']:.1f}us: {cells}")


if __name__ == "__main__":
    main()
