"""benchmarks/experiments/gluon_partition_regs.py: the register probe the README's account of the
Gluon kernels' spills rests on, run as a user runs it (a child with Triton 3.6, compiling for
sm_90 on the CPU). It must find every partition of each kernel, and the facts the README states:
consumer code runs past the launch's 168 registers under its setmaxnreg, and the two consumer
warpgroups' budgets add up to what 12 warps share beside the loader; and docs/mla-round3.md's
about the seesaw experiment (benchmarks/experiments/gluon_seesaw.py): it compiles, its consumers
sit at the same ceiling, and its spills against the ping-pong's with and without the loader warp."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kernelsearch.test_mla_gluon import _gluon_triton

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "benchmarks" / "experiments" / "gluon_partition_regs.py"


def test_probe_finds_each_partition_and_registers_past_the_launch_figure(tmp_path):
    env, why = _gluon_triton()
    if why:
        pytest.skip(why)
    out = tmp_path / "regs.json"
    r = subprocess.run([sys.executable, str(PROBE), "--json", str(out)], capture_output=True,
                       text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert len(doc) == 9 and all("pieces" in k for k in doc), [k.get("error") for k in doc]
    for k in doc:
        consumers = [p for p in k["pieces"] if p["hgmma"] > 0]
        assert len(consumers) == 2, k  # two warpgroups, each with its own wgmma code
        if "LOADER 0" in k["kernel"] or "without its loader" in k["kernel"]:
            # 8 warps: each consumer warpgroup at 240 (of the 256 a thread 8 warps may have)
            assert ".maxnreg 240" in k["ptx_head"] and ".reqntid 256" in k["ptx_head"], k
            assert [p["budget"] for p in consumers] == [240, 240], k
            assert all(168 < p["max_reg"] <= 240 for p in consumers), consumers
            continue
        assert ".maxnreg 168" in k["ptx_head"] and ".reqntid 384" in k["ptx_head"], k
        # code after setmaxnreg uses more than the kernel-wide 168, up to its own budget
        assert all(168 < p["max_reg"] <= p["budget"] for p in consumers), consumers
        # 12 warps share 384 x 168 registers: the consumers' budgets and the loader's fill it
        loader = [p for p in k["pieces"] if p["budget"] == 40]
        assert loader and sum(p["budget"] for p in consumers) * 128 + 128 * 40 <= 384 * 168, k
    # the table the script prints is the JSON's
    assert r.stdout.count("| piece |") == 9
    # the seesaw (docs/mla-round3.md): each consumer 44 HGMMA (S over 9 blocks, one 64 x 256
    # P V a tile, in k16 steps) where the ping-pong's has 52 (four 64 x 64 a tile); every
    # variant's consumers at their ceiling (within 3 registers of 232, or of 240 without the
    # loader warp). By ptxas's count, beside the loader warp both orders spill less than the
    # shipped ping-pong, LEAN least; without it both spill more than the ping-pong without it
    pp = next(k for k in doc if k["kernel"].startswith("dense gluon_pingpong"))
    nl = next(k for k in doc if "without its loader" in k["kernel"])
    seesaw = {k["kernel"].split(" (")[0] + (" LOADER 0" if "LOADER 0" in k["kernel"] else ""): k
              for k in doc if "seesaw" in k["kernel"]}
    assert sorted(seesaw) == ["dense seesaw LEAN 0", "dense seesaw LEAN 0 LOADER 0",
                              "dense seesaw LEAN 1", "dense seesaw LEAN 1 LOADER 0"], list(seesaw)
    for k in seesaw.values():
        consumers = [p for p in k["pieces"] if p["hgmma"] > 0]
        assert [p["hgmma"] for p in consumers] == [44, 44], k
        assert all(p["max_reg"] >= p["budget"] - 3 for p in consumers), consumers
    st = {n: k["ptxas_spills"]["stores"] for n, k in seesaw.items()}
    assert st["dense seesaw LEAN 1"] < st["dense seesaw LEAN 0"] < pp["ptxas_spills"]["stores"], st
    assert min(st["dense seesaw LEAN 0 LOADER 0"], st["dense seesaw LEAN 1 LOADER 0"]) > \
        nl["ptxas_spills"]["stores"] > 0, (st, nl["ptxas_spills"])
    assert all(p["hgmma"] == 52 for p in pp["pieces"] if p["hgmma"]), pp
