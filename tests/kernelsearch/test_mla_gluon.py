"""The Gluon MLA kernels (kernelsearch/families/mla_decode/gluon_wgmma.py, gluon_pingpong.py and
mla_sparse_decode/gluon_wgmma.py). Gluon does not run under TRITON_INTERPRET=1 (gluon.jit has no
interpreter path: triton 3.9 on this CPU asks for a GPU driver, 3.6 on the H200 the same), so CI
covers it two ways: on any machine, Triton 3.6 (the H200's, which bootstrap.sh installs beside
the venv's 3.9) compiles it for sm_90 from source (no GPU needed) and its PTX has the Hopper
instructions it is written for; on a Hopper GPU, its output against the float64 reference on
FlashMLA-style inputs (ragged, pages 64 and 16, NaN in every unread row). The H200 timings are in
benchmarks/results/mla-new-families-h200-2026-12-01-run*.json and mla-gluon-h200-2026-12-01-run3.*."""
import importlib.util
from pathlib import Path

import pytest
import torch

from kernelsearch.families import get, mla

DENSE = get("mla_decode")
FILE = DENSE.variants["gluon_wgmma"].file


COMPILE = r"""
import importlib.util, json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon

spec = importlib.util.spec_from_file_location("ks_mla_gluon_wgmma", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
ptr = ["Q", "KV", "BT", "SL", "O", "Op", "Lp"]
ty = ["*bf16", "*bf16", "*i32", "*i32", "*bf16", "*fp32", "*fp32"]
sig = dict(zip(ptr, ty))
sig.update({k: "i32" for k in ("H", "n_splits", "split_len")})
sig["qk_scale"] = "fp32"
sig.update({k: "i32" for k in ("sqb", "sqh", "sbt", "sob", "soh")})
sig.update({k: "constexpr" for k in ("PAGE", "BLOCK_H", "BLOCK_N", "STAGES", "ONE", "PIPE",
                                     "NOLOAD", "num_warps")})
# what the launcher specialises on a real call: 16-byte aligned pointers and strides
attrs = {(i,): [["tt.divisibility", 16]] for i in list(range(7)) + [11, 12, 14, 15]}
out = []
for pipe, stages, block_n in json.loads(sys.argv[2]):
    consts = {"PAGE": 64, "BLOCK_H": 64, "BLOCK_N": block_n, "STAGES": stages, "ONE": False,
              "PIPE": pipe, "NOLOAD": 0, "num_warps": 8}
    src = gluon._runtime.GluonASTSource(mod._mla_gluon_partial, signature=sig,
                                        constexprs=consts, attrs=attrs)
    ck = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8})
    ptx = ck.asm["ptx"]
    out.append({"sm90a": ".target sm_90a" in ptx, "wgmma": ptx.count("wgmma.mma_async"),
                "cp_async": ptx.count("cp.async"), "shared": ck.metadata.shared})
# the sparse kernel (mla_sparse_decode/gluon_wgmma.py): the same loop over gathered rows
spec = importlib.util.spec_from_file_location("ks_mla_sparse_gluon", sys.argv[3])
smod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(smod)
ssig = {"Q": "*bf16", "KV": "*bf16", "RW": "*i32", "O": "*bf16", "Op": "*fp32", "Lp": "*fp32"}
ssig.update({k: "i32" for k in ("H", "topk", "n_splits", "split_len")})
ssig["qk_scale"] = "fp32"
ssig.update({k: "i32" for k in ("nrows", "sqb", "sqh", "srb", "sob", "soh")})
ssig.update({k: "constexpr" for k in ("BLOCK_H", "BLOCK_N", "STAGES", "ONE", "PIPE", "NOLOAD",
                                      "num_warps")})
sattrs = {(i,): [["tt.divisibility", 16]] for i in list(range(6)) + [12, 13, 14, 15, 16]}
consts = {"BLOCK_H": 64, "BLOCK_N": 64, "STAGES": 2, "ONE": False, "PIPE": 1, "NOLOAD": 0,
          "num_warps": 8}
ck = triton.compile(gluon._runtime.GluonASTSource(smod._sparse_gluon_partial, signature=ssig,
                                                  constexprs=consts, attrs=sattrs),
                    target=GPUTarget("cuda", 90, 32), options={"num_warps": 8})
ptx = ck.asm["ptx"]
out.append({"sm90a": ".target sm_90a" in ptx, "wgmma": ptx.count("wgmma.mma_async"),
            "cp_async": ptx.count("cp.async"), "shared": ck.metadata.shared})
# the warp-specialized ping-pong kernel (gluon_pingpong.py): TMA tiles, mbarriers, setmaxnreg
spec = importlib.util.spec_from_file_location("ks_mla_pingpong", sys.argv[4])
pmod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pmod)
lay = gluon.language.NVMMASharedLayout.get_default_for([64, 64], gluon.language.bfloat16)
psig = {"Q": "*bf16", "kv_desc": f"tensordesc<bf16[64, 64],{lay}>", "BT": "*i32",
        "SL": "*i32", "O": "*bf16", "Op": "*fp32", "Lp": "*fp32"}
psig.update({k: "i32" for k in ("H", "n_splits", "split_len")})
psig["qk_scale"] = "fp32"
psig.update({k: "i32" for k in ("sqb", "sqh", "sbt", "sob", "soh")})
psig.update({k: "constexpr" for k in ("PAGE", "STAGES", "ONE", "PROBE", "num_warps")})
pattrs = {(i,): [["tt.divisibility", 16]] for i in [0, 2, 3, 4, 5, 6, 11, 12, 13, 14, 15]}
for one in (False, True):
    ck = triton.compile(gluon._runtime.GluonASTSource(
        pmod._mla_pingpong, signature=psig, attrs=pattrs,
        constexprs={"PAGE": 64, "STAGES": 2, "ONE": one, "PROBE": 0, "num_warps": 4}),
        target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "maxnreg": 168})
    ptx = ck.asm["ptx"]
    out.append({"sm90a": ".target sm_90a" in ptx, "wgmma": ptx.count("wgmma.mma_async"),
                "cp_async": ptx.count("cp.async.bulk.tensor"), "shared": ck.metadata.shared,
                "setmaxnreg": ptx.count("setmaxnreg"), "mbarrier": ptx.count("mbarrier.")})
def sass_counts(ck):
    # HGMMA and the waits ptxas put after them, from Triton's own cuobjdump
    import os, subprocess, tempfile
    from triton.backends.nvidia import compiler as nv
    exe = os.path.join(os.path.dirname(nv.get_ptxas(90).path), "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(ck.asm["cubin"]); f.flush()
        sass = subprocess.run([exe, "-sass", f.name], capture_output=True, text=True).stdout
    return {"hgmma": sass.count("HGMMA"), "depbar": sass.count("WARPGROUP.DEPBAR")}
# benchmarks/experiments/gluon_ahead.py (issue 35's experiment, not shipped): the same protocol
# with S issued ahead; no wgmma may stay in flight across a branch (ptxas serializes them all)
spec = importlib.util.spec_from_file_location("ks_mla_ahead", sys.argv[5])
amod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(amod)
ck = triton.compile(gluon._runtime.GluonASTSource(
    amod._mla_ahead, signature=psig, attrs=pattrs,
    constexprs={"PAGE": 64, "STAGES": 2, "ONE": False, "PROBE": 0, "num_warps": 4}),
    target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "maxnreg": 168})
ptx = ck.asm["ptx"]
out.append({"sm90a": ".target sm_90a" in ptx, "wgmma": ptx.count("wgmma.mma_async"),
            "cp_async": ptx.count("cp.async.bulk.tensor"), "shared": ck.metadata.shared,
            "setmaxnreg": ptx.count("setmaxnreg"), "mbarrier": ptx.count("mbarrier."),
            **sass_counts(ck)})
# mla_sparse_decode/gluon_pingpong.py: the ping-pong over gathered rows (cp.async loader warp)
spec = importlib.util.spec_from_file_location("ks_mla_sparse_pingpong", sys.argv[6])
spmod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(spmod)
spsig = {"Q": "*bf16", "KV": "*bf16", "RW": "*i32", "BT": "*i32", "SL": "*i32", "O": "*bf16",
         "Op": "*fp32", "Lp": "*fp32"}
spsig.update({k: "i32" for k in ("H", "topk", "n_splits", "split_len")})
spsig["qk_scale"] = "fp32"
spsig.update({k: "i32" for k in ("nrows", "cap", "sqb", "sqh", "srb", "sbt", "sob", "soh")})
spsig.update({k: "constexpr" for k in ("PAGE", "POS", "STAGES", "ONE", "LOADERS", "P_SMEM",
                                       "num_warps")})
spattrs = {(i,): [["tt.divisibility", 16]] for i in list(range(8)) + [15, 16, 17, 19, 20]}
# both loader widths, P from registers / smem; positions mapped in the loaders / rows as given
for loaders, p_smem, pos in ((2, False, True), (4, True, False)):
    ck = triton.compile(gluon._runtime.GluonASTSource(
        spmod._sparse_pingpong, signature=spsig, attrs=spattrs,
        constexprs={"PAGE": 64, "POS": pos, "STAGES": 2, "ONE": False, "LOADERS": loaders,
                    "P_SMEM": p_smem, "num_warps": 4}),
        target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "maxnreg": 168})
    ptx = ck.asm["ptx"]
    out.append({"sm90a": ".target sm_90a" in ptx, "wgmma": ptx.count("wgmma.mma_async"),
                "cp_async": ptx.count("cp.async.cg") + ptx.count("cp.async.ca"),
                "shared": ck.metadata.shared, "setmaxnreg": ptx.count("setmaxnreg"),
                "mbarrier": ptx.count("mbarrier."),
                "cp_async_arrive": ptx.count("cp.async.mbarrier.arrive"), **sass_counts(ck)})
print("TRITON " + triton.__version__)
print("RESULT " + json.dumps(out))
"""
PINGPONG_FILE = DENSE.variants["gluon_pingpong"].file
SPARSE_FILE = get("mla_sparse_decode").variants["gluon_wgmma"].file
SPARSE_PINGPONG_FILE = get("mla_sparse_decode").variants["gluon_pingpong"].file
AHEAD_FILE = Path(__file__).resolve().parents[2] / "benchmarks" / "experiments" / "gluon_ahead.py"


def _gluon_triton() -> tuple[dict, str]:
    """The child's environment for the compile check: the H200's Triton that bootstrap.sh puts
    beside the venv's (.venv/triton-gluon, constraints/gluon.txt), else the venv's own where it
    has 3.6's Gluon names; (env, '') or ({}, why not)."""
    import os
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    side = Path(sys.prefix) / "triton-gluon"
    root = str(Path(__file__).resolve().parents[2])
    if (side / "triton").is_dir():
        env["PYTHONPATH"] = os.pathsep.join([str(side), root])
        return env, ""
    pytest.importorskip("triton.experimental.gluon")
    from kernelsearch.families import gluon

    if gluon._names_missing():  # the files are written against Triton 3.6's Gluon names
        return {}, f"this Triton lacks {gluon._names_missing()} and {side} is missing"
    return env, ""


def test_gluon_kernel_compiles_for_hopper_with_wgmma_and_async_copies():
    """In a child without TRITON_INTERPRET (the suite's conftest sets it; this kernel is compiled,
    never interpreted), with Triton 3.6 (the H200's: what the files are written against)."""
    import json
    import subprocess
    import sys

    env, why = _gluon_triton()
    if why:
        pytest.skip(why)
    cfgs = [(1, 2, 64), (0, 2, 64), (1, 4, 32)]
    r = subprocess.run([sys.executable, "-c", COMPILE, str(FILE), json.dumps(cfgs),
                        str(SPARSE_FILE), str(PINGPONG_FILE), str(AHEAD_FILE),
                        str(SPARSE_PINGPONG_FILE)],
                       capture_output=True, text=True, env=env, timeout=600)
    line = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    assert r.returncode == 0 and line, r.stderr[-3000:]
    results = json.loads(line[0][7:])
    if "PYTHONPATH" in env and "triton-gluon" in env["PYTHONPATH"]:  # the side install: 3.6
        assert "TRITON 3.6.0" in r.stdout.splitlines(), r.stdout[-500:]
    assert len(results) == len(cfgs) + 6
    for cfg, res in zip(cfgs + ["sparse", "pingpong", "pingpong one", "ahead", "sparse pingpong",
                                "sparse pingpong 4 loaders, P in smem"], results):
        assert res["sm90a"], cfg
        assert res["wgmma"] > 0 and res["cp_async"] > 0, (cfg, res)
        assert res["shared"] <= 227 * 1024, (cfg, res)  # the ring fits an SM's shared memory
    for res in results[-5:]:  # partitions with their own register budgets, mbarrier protocol
        assert res["setmaxnreg"] > 0 and res["mbarrier"] > 0, res
    # the sparse loaders' copies complete on the ring's mbarrier (one arrive a thread a tile)
    for res in results[-2:]:
        assert res["cp_async_arrive"] > 0, res
    # the experiment's S and P V each end in one wait: a few waits in the SASS, not one after
    # every HGMMA (how ptxas shows a pipeline it serialized: an earlier draft kept S in flight
    # across an mbarrier wait and had 240 of 240)
    for res in results[-3:]:
        assert 0 < res["depbar"] < res["hgmma"] // 4, res


@pytest.mark.skipif(not torch.cuda.is_available()
                    or torch.cuda.get_device_capability()[0] != 9, reason="needs a Hopper GPU")
@pytest.mark.parametrize("shape", [(7, 128, 5000, 64, 1), (3, 128, 2049, 16, 1)])
def test_gluon_kernel_matches_the_reference_on_flashmla_style_inputs(shape, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    from kernelsearch.harness.correctness import compare

    spec = importlib.util.spec_from_file_location("ks_mla_gluon_wgmma", FILE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    args = DENSE.make_inputs(shape, "bfloat16", "cuda", torch.Generator().manual_seed(3))
    flat = args[1].view(-1, mla.D_QK)
    flat[(flat == mla.POISON).all(dim=1)] = float("nan")
    ref = DENSE.reference(*args)
    for cfg in (dict(BLOCK_N=64, STAGES=2, GRID=132, PIPE=1),
                dict(BLOCK_N=32, STAGES=4, GRID=528, PIPE=1)):
        compare(mod.forward(*args, **cfg), ref, "bfloat16", DENSE, f"gluon {shape} {cfg}")


@pytest.mark.skipif(not torch.cuda.is_available()
                    or torch.cuda.get_device_capability()[0] != 9, reason="needs a Hopper GPU")
@pytest.mark.parametrize("shape", [(7, 128, 5000, 64, 2048, 1), (3, 128, 1500, 16, 2048, 1)])
def test_sparse_gluon_kernel_matches_the_reference(shape, monkeypatch):
    from kernelsearch.harness.correctness import compare

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    fam = get("mla_sparse_decode")
    spec = importlib.util.spec_from_file_location("ks_mla_sparse_gluon", SPARSE_FILE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    args = fam.make_inputs(shape, "bfloat16", "cuda", torch.Generator().manual_seed(3))
    flat = args[1].view(-1, mla.D_QK)
    flat[(flat == mla.POISON).all(dim=1)] = float("nan")
    ref = fam.reference(*args)
    for cfg in (dict(BLOCK_N=64, STAGES=2, GRID=132), dict(BLOCK_N=32, STAGES=4, GRID=264)):
        compare(mod.forward(*args, **cfg), ref, "bfloat16", fam, f"gluon sparse {shape} {cfg}")


@pytest.mark.skipif(not torch.cuda.is_available()
                    or torch.cuda.get_device_capability()[0] != 9, reason="needs a Hopper GPU")
@pytest.mark.parametrize("shape", [(7, 128, 5000, 64, 2048, 1), (3, 128, 1500, 16, 2048, 1),
                                   (5, 16, 3000, 64, 512, 1), (3, 128, 100, 64, 2048, 1)])
def test_sparse_pingpong_matches_the_reference(shape, monkeypatch):
    """Ragged, fewer valid indices than top-k, NaN in every unread row, 16 heads, splits whose
    tiles select nothing (the running max stays -inf there); positions mapped by the loaders
    (FOLD=1) and by the rows kernel first (the default)."""
    from kernelsearch.harness.correctness import compare

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    fam = get("mla_sparse_decode")
    spec = importlib.util.spec_from_file_location("ks_mla_sparse_pingpong", SPARSE_PINGPONG_FILE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    args = fam.make_inputs(shape, "bfloat16", "cuda", torch.Generator().manual_seed(3))
    flat = args[1].view(-1, mla.D_QK)
    flat[(flat == mla.POISON).all(dim=1)] = float("nan")
    ref = fam.reference(*args)
    for cfg in (dict(GRID=4, FOLD=1), dict(GRID=132, LOADERS=4, P_SMEM=1, FOLD=1),
                dict(GRID=1056, P_SMEM=1, FOLD=1), dict(GRID=132)):
        compare(mod.forward(*args, **cfg), ref, "bfloat16", fam, f"sparse pingpong {shape} {cfg}")


# ---- the Gluon variants as registered variants (kernelsearch.families.gluon) ----------------
GLUON_VARIANTS = [(f, n) for f in ("mla_decode", "mla_sparse_decode")
                  for n, v in get(f).variants.items() if v.gpu_only]


def test_each_family_registers_its_gluon_variant_gpu_only():
    assert ("mla_decode", "gluon_wgmma") in GLUON_VARIANTS
    assert ("mla_sparse_decode", "gluon_wgmma") in GLUON_VARIANTS
    for f, n in GLUON_VARIANTS:
        v = get(f).variants[n]
        assert v.kind == "triton" and v.file.exists() and "@gluon.jit" in v.file.read_text()


@pytest.mark.parametrize("family,name", GLUON_VARIANTS)
def test_guard_accepts_each_registered_gluon_file(family, name):
    from kernelsearch.harness.guard import check_source

    assert check_source(get(family).variants[name].file.read_text()) == []


@pytest.mark.parametrize("rule", ["jit_body", "shim"])
def test_guard_still_refuses_a_gluon_file_with_a_forbidden_name(rule):
    from kernelsearch.harness.guard import check_source

    src = FILE.read_text()
    assert "gl.thread_barrier()" in src
    if rule == "jit_body":  # a name Gluon's API does not list (arbitrary PTX) in the kernel
        bad = src.replace("gl.thread_barrier()", "gl.inline_asm_elementwise('bar.sync 0;', "
                          "'=r', [], gl.int32, True, 1)", 1)
    else:  # the Triton 3.6/3.9 name shim the files used to carry (reflection at module level)
        bad = src.replace("\n@gluon.jit", "\n_barrier = getattr(gl, 'thread_barrier', None) "
                          "or gl.barrier\n\n\n@gluon.jit", 1)
        bad = bad.replace("gl.thread_barrier()", "_barrier()")
    got = check_source(bad)
    assert got, rule
    if rule == "jit_body":
        assert any(v.rule == "jit_body" and "inline_asm_elementwise" in v.message for v in got)
    else:
        assert {"module_state", "jit_body"} <= {v.rule for v in got}


def _offer(monkeypatch, gpu: str, missing: tuple = ()):
    from kernelsearch.families import gluon

    monkeypatch.setattr(gluon, "_gpu", lambda: gpu)
    monkeypatch.setattr(gluon, "_names_missing", lambda: missing)


@pytest.mark.parametrize("family,name", GLUON_VARIANTS)
def test_gluon_variant_is_not_offered_without_a_hopper_gpu_or_under_the_interpreter(
        family, name, monkeypatch):
    from kernelsearch.families import gluon

    fam = get(family)
    shape = fam.search_shapes[0]
    # as this CPU machine is (the suite runs under TRITON_INTERPRET=1, no GPU)
    assert not gluon.available() and gluon.why_not()
    assert all(v != name for v, _ in fam.space(shape))
    # a Hopper GPU with the right Triton, but the interpreter: still not offered
    _offer(monkeypatch, "")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert "TRITON_INTERPRET" in gluon.why_not()
    assert all(v != name for v, _ in fam.space(shape))
    # another GPU, or a Triton without 3.6's Gluon names: not offered, and why
    monkeypatch.delenv("TRITON_INTERPRET")
    _offer(monkeypatch, "GPU is sm_80, not sm_90")
    assert gluon.why_not() == "GPU is sm_80, not sm_90"
    assert all(v != name for v, _ in fam.space(shape))
    _offer(monkeypatch, "", ("triton.experimental.gluon.language.thread_barrier",))
    assert "thread_barrier" in gluon.why_not()
    assert all(v != name for v, _ in fam.space(shape))
    # all of it there: offered like any variant, with its whole valid grid
    _offer(monkeypatch, "")
    assert gluon.available()
    got = [c for v, c in fam.space(shape) if v == name]
    var = fam.variants[name]
    assert got and len(got) == len([c for c in var.configs() if var.tile_valid(c, shape)])
    if name == "gluon_wgmma":  # its tile rule: the ring and q in 227 KiB of shared memory
        assert not var.valid(dict(BLOCK_N=64, GRID=132, STAGES=3, PIPE=1), shape)


def test_search_space_offers_the_gluon_variant_only_where_it_runs(monkeypatch):
    from tuner.search.kernel import kernel_space

    shape = DENSE.search_shapes[0]
    names = next(d.values for d in kernel_space("mla_decode", shape).dims
                 if d.name == "variant")
    assert "gluon_wgmma" not in names and "tma" in names  # this CPU: not a choice
    _offer(monkeypatch, "")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    space = kernel_space("mla_decode", shape)
    assert "gluon_wgmma" in next(d.values for d in space.dims if d.name == "variant")
    pt = {d.name: d.values[0] for d in space.dims}
    pt.update(variant="gluon_wgmma", BLOCK_N=64, GRID=132, STAGES=2, PIPE=1)
    assert space.valid(pt)
    assert not space.valid(dict(pt, STAGES=3))  # its own tile rule still applies


def test_table_runs_a_gluon_entry_only_where_it_is_offered(monkeypatch):
    from kernelsearch.table import DispatchTable, Entry

    cfg = dict(BLOCK_N=64, GRID=132, STAGES=2, PIPE=1)
    e = Entry(family="mla_decode", dtype="bfloat16", match={"H": 128, "P": 64},
              ranges={"B": [1, 128], "L": [1, 163840]}, variant="gluon_wgmma", config=cfg)
    t = DispatchTable(entries=[e])
    dims = {"B": 64, "H": 128, "L": 4096, "P": 64, "R": 1}
    how, entry, _ = t.choose("mla_decode", "bfloat16", dims)
    assert how in ("library", "torch") and entry is None  # this CPU: the fallback runs
    _offer(monkeypatch, "")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    how, entry, var = t.choose("mla_decode", "bfloat16", dims)
    assert (how, var) == ("table", "gluon_wgmma") and entry is e


@pytest.mark.skipif(not torch.cuda.is_available()
                    or torch.cuda.get_device_capability()[0] != 9, reason="needs a Hopper GPU")
@pytest.mark.parametrize("shape,grid", [((7, 128, 5000, 64, 1), 132), ((7, 128, 5000, 64, 1), 1056),
                                        ((3, 128, 2049, 16, 1), 264), ((2, 128, 4096, 128, 1), 264),
                                        ((1, 16, 1000, 64, 1), 132), ((4, 128, 300, 64, 0), 4)])
def test_pingpong_kernel_matches_the_reference(shape, grid, monkeypatch):
    """TMA pages (64, 128: NaN in every unread row, two empty sequences with garbage table
    slots), the cp.async fallback (page 16), 16 heads, one split (the direct-output path)."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    from kernelsearch.harness.correctness import compare

    spec = importlib.util.spec_from_file_location("ks_mla_pingpong", PINGPONG_FILE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    args = DENSE.make_inputs(shape, "bfloat16", "cuda", torch.Generator().manual_seed(5))
    q, kv, bt, sl, sc = args
    flat = kv.view(-1, mla.D_QK)
    flat[(flat == mla.POISON).all(dim=1)] = float("nan")
    if shape[0] == 7:
        sl[1] = 0
        sl[4] = 0
        bt[1] = 2147480000
        bt[4, 1:] = 2147480000
    ref = DENSE.reference(*args)
    got = mod.forward(*args, GRID=grid)
    compare(got, ref, "bfloat16", DENSE, f"gluon_pingpong {shape} GRID={grid}")
    if shape[0] == 7:
        assert torch.equal(got[1], torch.zeros_like(got[1]))


def test_kernel_families_says_where_the_gluon_variants_are_not_offered(tmp_path):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root), TRITON_INTERPRET="1",
               KERNELSEARCH_SANDBOX_USER="none")

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "tuner", "--state-dir", str(tmp_path),
                               "kernel", "families", *args], capture_output=True, text=True,
                              cwd=root, env=env, timeout=300)

    p = cli("--json")
    assert p.returncode == 0, p.stderr
    fams = {f["family"]: f for f in json.loads(p.stdout)["families"]}
    assert fams["mla_decode"]["gpu_only_variants"] == {
        "gluon_wgmma": "TRITON_INTERPRET=1 (Gluon has no interpreter path)",
        "gluon_pingpong": "TRITON_INTERPRET=1 (Gluon has no interpreter path)"}
    assert fams["softmax"]["gpu_only_variants"] == {}
    line = next(x for x in cli().stdout.splitlines() if x.startswith("mla_decode "))
    assert "gluon_pingpong (gluon, sm_90 only: TRITON_INTERPRET=1" in line


GLUON_FILES = [PINGPONG_FILE, FILE, SPARSE_FILE]


def test_guard_tells_a_gluon_candidate_from_a_triton_one(tmp_path):
    from kernelsearch.harness import guard

    assert all(guard.uses_gluon(f.read_text()) for f in GLUON_FILES)
    assert not guard.uses_gluon(DENSE.variants["tma"].file.read_text())
    # by what the decorator resolves to, not by its spelling
    src = PINGPONG_FILE.read_text()
    assert "from triton.experimental import gluon\n" in src
    aliased = src.replace("from triton.experimental import gluon\n",
                          "from triton.experimental import gluon as g\n").replace("@gluon.jit",
                                                                                  "@g.jit")
    assert "@gluon.jit" not in aliased and guard.uses_gluon(aliased)
    assert not guard.uses_gluon("def forward(:\n")  # does not parse: the guard names that


@pytest.mark.parametrize("path", GLUON_FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_a_gluon_candidate_where_it_cannot_run_gets_one_verdict_saying_so(path, monkeypatch):
    """On the interpreter (this CPU) or a GPU other than sm_90, a Gluon candidate is not run
    (the compiler would fail looking for a driver): the verdict names the reason."""
    from kernelsearch.families import gluon
    from kernelsearch.harness import check

    family = path.parent.name
    v = check(family, path, isolate=False, timing=False)
    assert (v.verdict, v.stage, v.code, v.rule) == ("rejected", "guard", "needs_gpu", "gluon"), v
    assert "sm_90" in v.detail and "no interpreter path" in v.detail
    # the judge itself (what runs in the judge's child) says the same
    from kernelsearch.harness.judge import judge

    w = judge(family, path.read_text(), device="cpu", timing=False)
    assert (w.stage, w.code, w.rule, w.detail) == (v.stage, v.code, v.rule, v.detail)
    monkeypatch.setattr(gluon, "_gpu", lambda: "GPU is sm_80, not sm_90")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert gluon.why_not_on("cuda") == "GPU is sm_80, not sm_90"
    monkeypatch.setattr(gluon, "_gpu", lambda: "")
    assert gluon.why_not_on("cuda") == "" and gluon.why_not_on("cpu")
    # the trial reason a search records for it is the harness's code
    from tuner.trial import REASONS

    assert "sm_90" in REASONS["needs_gpu"]


def test_kernel_check_of_a_gluon_file_without_hopper_is_bad_input(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root), TRITON_INTERPRET="1",
               KERNELSEARCH_SANDBOX_USER="none")
    p = subprocess.run([sys.executable, "-m", "tuner", "--state-dir", str(tmp_path / "st"),
                        "kernel", "check", "--family", "mla_decode", "--candidate",
                        str(PINGPONG_FILE), "--device", "cpu"],
                       capture_output=True, text=True, cwd=root, env=env, timeout=300)
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = (p.stdout + p.stderr).strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr, lines
    assert "Gluon" in lines[0] and "sm_90" in lines[0] and "gluon_pingpong.py" in lines[0]
    assert not (tmp_path / "st").exists() or not any((tmp_path / "st").rglob("*.json"))
