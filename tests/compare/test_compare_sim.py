"""`metaltune compare` on two simulated hosts, one made with --vm: the canonical "bare metal vs VM,
same GPU" report, checked end to end through the CLI and the child processes."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def mt(*args, timeout=180):
    return subprocess.run([sys.executable, "-m", "tuner", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=timeout)


@pytest.fixture(scope="module")
def sims(tmp_path_factory):
    d = tmp_path_factory.mktemp("sims")
    for name, extra in (("bare", []), ("vm", ["--vm"])):
        r = mt("sim", "init", str(d / name), "--sku", "h200", *extra)
        assert r.returncode == 0, r.stderr
    return d / "bare", d / "vm"


def test_bare_metal_vs_vm_report(sims, tmp_path):
    bare, vm = sims
    rep_dir = tmp_path / "report"
    r = mt("compare", f"sim://{bare}", f"sim://{vm}", "--seed", "7", "--report", str(rep_dir), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["baseline"] == f"sim://{bare}"
    cmp = {m["name"]: m["comparisons"][0] for m in doc["metrics"]}
    # what a VM costs in the sim's model (tuner/compare/simbench.py documents each assumption)
    lat = cmp["launch_eager_us"]
    assert lat["low"] > 1.15 and lat["verdict"].startswith("worse")
    assert cmp["h2d_pageable_gbps"]["high"] < 0.75 and cmp["h2d_pageable_gbps"]["verdict"].startswith("worse")
    assert cmp["decode_eager_tok_s"]["high"] < 0.9
    # the GPU itself is passed through: GEMM and device copy do not change
    assert cmp["gemm_bf16_tflops"]["verdict"] == "within noise"
    assert cmp["device_copy_tbps"]["verdict"] == "within noise"
    assert cmp["nccl_allreduce_busbw_gbps"]["verdict"] == "not comparable"   # one GPU each
    facts = {f["fact"]: f["values"] for f in doc["facts"]}
    assert facts["virtualisation"] == ["bare-metal", "vm"]
    assert facts["gpu_passthrough"] == ["none", "passthrough"]
    assert "virtualisation" in doc["facts_differing"] and "gpu_name" not in doc["facts_differing"]
    assert facts["gpu_name"][0] == facts["gpu_name"][1] and "H200" in facts["gpu_name"][0]
    files = {p.name for p in rep_dir.iterdir()}
    assert {"report.json", "report.md", "report.html", "metrics.png", "ratios.png"} <= files
    md = (rep_dir / "report.md").read_text()
    assert "launch_eager_us" in md and "| virtualisation | bare-metal | vm | **yes** |" in md


def test_profile_state_moves_the_sim_numbers(sims, tmp_path):
    """A sim host throttled to its minimum power limit measures slower GEMM and decode than the
    same host at defaults: the sim numbers come from its state, not from a table."""
    bare, _ = sims
    import shutil

    slow = tmp_path / "slow"
    shutil.copytree(bare, slow, symlinks=True)
    from tuner.sim.state import SimState  # the sim's own state API

    st = SimState(slow)
    with st.edit() as s:
        for g in s["gpus"]:
            g["power_limit_mw"] = 200_000
    r = mt("compare", f"sim://{bare}", f"sim://{slow}", "--seed", "3", "--json",
           "--only", "gemm_bf16_tflops,decode_tok_s,h2d_pinned_gbps")
    assert r.returncode == 0, r.stderr
    cmp = {m["name"]: m["comparisons"][0] for m in json.loads(r.stdout)["metrics"]}
    assert cmp["decode_tok_s"]["high"] < 0.95
    assert cmp["gemm_bf16_tflops"]["high"] < 0.95
    # the power limit does not move copies over PCIe: any difference is the sim's 1.5% noise
    # (a verdict would be "within noise" 95% of the time, so the test checks the size instead)
    assert abs(cmp["h2d_pinned_gbps"]["ratio"] - 1.0) < 0.04
