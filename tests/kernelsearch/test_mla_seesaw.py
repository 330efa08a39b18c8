"""benchmarks/experiments/gluon_seesaw.py (issue 45's experiment, not shipped, never run on a
GPU): FlashMLA's seesaw schedule for dense MLA decode in Gluon. No GPU here, so as the other
Gluon kernels' compile test (tests/kernelsearch/test_mla_gluon.py): Triton 3.6 (the H200's)
compiles it for sm_90 in a child without TRITON_INTERPRET, and the PTX / SASS have what the
schedule is written for: each consumer warpgroup's wgmma (S over nine blocks, P V on its half
of V for both tiles of a pair), the TMA loads (by the loader warp, or with LOADER=0 by the
consumers), the exchange between the warpgroups (mbarriers, each signal behind a named barrier
of the warpgroup's 128 threads) and no serialized wgmma. The registers and spills are
tests/kernelsearch/test_gluon_partition_regs.py's."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kernelsearch.test_mla_gluon import _gluon_triton

FILE = Path(__file__).resolve().parents[2] / "benchmarks" / "experiments" / "gluon_seesaw.py"

COMPILE = r"""
import importlib.util, json, os, re, subprocess, sys, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia import compiler as nv
from triton.experimental import gluon

spec = importlib.util.spec_from_file_location("ks_mla_seesaw", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
lay = gluon.language.NVMMASharedLayout.get_default_for([64, 64], gluon.language.bfloat16)
sig = {"Q": "*bf16", "kv_desc": f"tensordesc<bf16[64, 64],{lay}>", "BT": "*i32", "SL": "*i32",
       "O": "*bf16", "Op": "*fp32", "Lp": "*fp32"}
sig.update({k: "i32" for k in ("H", "n_splits", "split_len")})
sig["qk_scale"] = "fp32"
sig.update({k: "i32" for k in ("sqb", "sqh", "sbt", "sob", "soh")})
sig.update({k: "constexpr" for k in ("PAGE", "STAGES", "ONE", "LEAN", "LOADER", "num_warps")})
attrs = {(i,): [["tt.divisibility", 16]] for i in [0, 2, 3, 4, 5, 6, 11, 12, 13, 14, 15]}
exe = os.path.join(os.path.dirname(nv.get_ptxas(90).path), "cuobjdump")
out = []
for lean, loader, one in ((0, 1, False), (1, 1, False), (0, 0, False), (1, 0, False),
                         (1, 1, True)):
    ck = triton.compile(gluon._runtime.GluonASTSource(
        mod._mla_seesaw, signature=sig, attrs=attrs,
        constexprs={"PAGE": 64, "STAGES": 2, "ONE": one, "LEAN": lean, "LOADER": loader,
                    "num_warps": 4}),
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": 4, "maxnreg": 168 if loader else 240})
    ptx = ck.asm["ptx"]
    mma = re.findall(r"wgmma\.mma_async[^;]*;", ptx, re.S)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(ck.asm["cubin"]); f.flush()
        sass = subprocess.run([exe, "-sass", f.name], capture_output=True, text=True).stdout
    out.append({"lean": lean, "loader": loader, "one": one, "sm90a": ".target sm_90a" in ptx,
                "wgmma": len(mma),
                # A from registers: the accumulator's {...} then A's {...}
                "wgmma_rs": sum(bool(re.search(r"\}\s*,\s*\{", s)) for s in mma),
                "tma": ptx.count("cp.async.bulk.tensor"), "setmaxnreg": ptx.count("setmaxnreg"),
                "arrive": ptx.count("mbarrier.arrive.shared"),
                "try_wait": ptx.count("mbarrier.try_wait"),
                "bar128": len(re.findall(r"bar\.sync\s+\d+, 128;", ptx)),
                "shared": ck.metadata.shared, "hgmma": sass.count("HGMMA"),
                "depbar": sass.count("WARPGROUP.DEPBAR")})
print("TRITON " + triton.__version__)
print("RESULT " + json.dumps(out))
"""


def test_seesaw_compiles_for_hopper_with_its_exchange_between_the_warpgroups():
    env, why = _gluon_triton()
    if why:
        pytest.skip(why)
    r = subprocess.run([sys.executable, "-c", COMPILE, str(FILE)], capture_output=True,
                       text=True, env=env, timeout=600)
    line = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    assert r.returncode == 0 and line, r.stderr[-3000:]
    if "PYTHONPATH" in env and "triton-gluon" in env["PYTHONPATH"]:  # the side install: 3.6
        assert "TRITON 3.6.0" in r.stdout.splitlines(), r.stdout[-500:]
    results = json.loads(line[0][7:])
    assert len(results) == 5
    for res in results:
        assert res["sm90a"] and res["setmaxnreg"] > 0, res
        # a pair a loop: each consumer 9 wgmma (64 x 64) for its S and one 64 x 256 P V on its
        # half of V for each tile, each K = 64 as four k16 steps: 2 x (9 + 2) x 4
        assert res["wgmma"] == 88 and res["hgmma"] == 88, res
        # TMA of [64, 64] blocks: the loader's nine a tile; without it the first two tiles
        # (18) and each consumer's reloads of the groups it read last (2 x 9)
        assert res["tma"] == (9 if res["loader"] else 36), res
        assert res["shared"] <= 227 * 1024, res  # q and two tiles fit an SM's shared memory
        # the exchange: FlashMLA's order signals four mbarriers a pair (max and factor each
        # way, then each P), LEAN two; beside them each warpgroup tells the loader it is done
        # with its V half and block 8 of both tiles (8; without the loader only block 8's, 4)
        # and signals the end (2)
        xchg = 4 if res["lean"] == 0 else 2
        assert res["arrive"] == xchg + (8 if res["loader"] else 4) + 2, res
        # and the waits: each warpgroup its S tile's nine blocks and its V half of the other
        # tile (2 x 13), the exchange, the end (2), and the loader's for each group to be free
        # (3) or, without it, the two reloaders' for both readers of block 8 (2)
        assert res["try_wait"] == 2 * 13 + xchg + 2 + (3 if res["loader"] else 2), res
        assert res["bar128"] > 0, res  # each signal after a named barrier of one warpgroup
        # no wgmma stays in flight across a wait: a few waits, not one after every HGMMA
        assert 0 < res["depbar"] < res["hgmma"] // 4, res
        # FlashMLA's order takes its own P from registers (4 k16 steps a consumer); LEAN
        # reads every P from shared memory
        assert res["wgmma_rs"] == (8 if res["lean"] == 0 else 0), res
