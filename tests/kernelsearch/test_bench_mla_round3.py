"""benchmarks/bench_mla_round3.py and mla_round3_h200.sh, the parts that run without a GPU:
the case list (every new head count, query length, context and a ragged batch for dense,
sparse bf16 and FP8), the memory-floor arithmetic from the copied H200 ceilings, the table,
and bad arguments as one-line errors (exit 2). The GPU sweep itself runs on the H200."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_mla_round3 as r3  # noqa: E402

TBPS = 4.237205460751674  # docs/readings/h200-ceilings-2026-11-29.json read_sum_TBps


def _plan(*argv):
    return r3.plan(r3.parser().parse_args(["--dry-run", *argv]))


def test_the_plan_covers_every_new_case_in_target_order():
    p = _plan()
    cs = p["cases"]
    assert len(cs) == 4 * (2 * 5 + 5 + 5)  # heads x (dense s_q 1, 2; sparse; fp8) x 5 points
    assert [c["H"] for c in cs] == sorted(c["H"] for c in cs)  # 16 and 32 heads run first
    for h in (16, 32, 64, 128):
        dense = [c for c in cs if c["H"] == h and c["kind"] == "dense"]
        assert {c["sq"] for c in dense} == {1, 2}
        assert {c["L"] for c in dense} == {4096, 16384, 32768, 131072}
        for kind in ("dense", "sparse", "fp8"):
            assert any(c["ragged"] for c in cs if c["H"] == h and c["kind"] == kind)
    assert all(c["sq"] == 1 for c in cs if c["kind"] != "dense")
    fams = {(c["kind"], c["sq"]): c["family"] for c in cs}
    assert fams == {("dense", 1): "mla_decode", ("dense", 2): "mla_decode_mtp",
                    ("sparse", 1): "mla_sparse_decode", ("fp8", 1): "mla_sparse_decode_fp8"}
    mtp = next(c for c in cs if c["family"] == "mla_decode_mtp")
    assert len(mtp["shape"]) == 6 and mtp["shape"][4] == 2  # the family's (B,H,L,P,S,R)


def test_memory_floor_is_the_bytes_read_at_the_measured_bandwidth():
    copy = json.loads((ROOT / "benchmarks/results/h200-ceilings-2026-11-29.json").read_text())
    assert "h200-ceilings-2026-11-29.json" in copy["source"] and copy["date"] == "2026-11-29"
    assert r3.read_tbps() == pytest.approx(TBPS)
    by = {c["label"]: c for c in _plan()["cases"]}
    # dense, 16 heads, 8 x 128k: every cached row once (1152 bytes), q in and out, the lengths
    want = (8 * 131072 * 1152 + 8 * 16 * (576 + 512) * 2 + 8 * 4) / (TBPS * 1e12) * 1e6
    assert by["dense 16h sq1 8x128k"]["floor_us_full"] == pytest.approx(want)
    assert by["dense 16h sq1 8x128k"]["floor_us_full"] == pytest.approx(285.1, abs=0.1)
    # two query tokens read the rows once: only q and the output double
    assert (by["dense 16h sq2 8x128k"]["floor_us_full"] - want) == pytest.approx(
        8 * 16 * 1088 * 2 / (TBPS * 1e12) * 1e6)
    # FP8: 656 bytes a selected row, the top-2048 of each sequence, the indices read
    fp8 = (8 * 2048 * 656 + 8 * 16 * 1088 * 2 + 8 * 4 + 8 * 2048 * 4) / (TBPS * 1e12) * 1e6
    assert by["fp8 16h sq1 8x128k"]["floor_us_full"] == pytest.approx(fp8)
    # 16 heads are memory-bound, 128 dense heads compute-bound (FlashMLA's sweet spot)
    assert by["dense 16h sq1 8x128k"]["bound"] == "memory"
    assert by["dense 128h sq1 8x128k"]["bound"] == "compute"
    # a ragged batch's floor comes from the lengths it draws, on the GPU
    assert by["dense 16h sq1 64x32k ragged"]["floor_us_full"] is None


def test_table_names_the_winner_and_how_far_ahead_of_the_library():
    row = {"case": "dense 16h sq2 8x128k", "floor_us": 285.2, "compute_us": 99.3, "impls": {
        "fitted {}": {"project": True, "check": "ok", "us": 310.0, "pct_floor": 92.0},
        "splitkv {}": {"project": True, "check": "FAILED: tolerance"},
        "flashmla": {"project": False, "check": "ok", "us": 372.0, "pct_floor": 76.7}}}
    r3.summarise(row)
    assert row["best_project"] == "fitted {}" and row["x_library"] == pytest.approx(1.2)
    md = r3.table_md([row, {"case": "fp8 128h sq1 8x128k", "skipped": "deadline"}])
    assert "| fitted {} | 310.0 | 92.0 | flashmla | 372.0 |" in md
    assert "skipped: deadline" in md


@pytest.mark.parametrize("argv,words", [
    (["--points", "8x0"], "BxCONTEXT"), (["--kinds", "dense,mtp"], "dense,sparse,fp8"),
    (["--sq", "3"], "--sq"), (["--heads", "a"], "integers"),
    (["--ceilings", "/nonexistent.json"], "read_sum_TBps"), ([], "--out")])
def test_bad_arguments_are_one_line_errors(argv, words):
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks/bench_mla_round3.py"), *argv],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert "Traceback" not in p.stderr and words in p.stderr.strip().splitlines()[-1]


def test_h200_script_dry_run_prints_the_plan_without_building():
    env = {**os.environ, "DRY_RUN": "1", "PYTHON": sys.executable,
           "ARGS": "--heads 16,32 --kinds dense"}
    p = subprocess.run(["bash", str(ROOT / "benchmarks/mla_round3_h200.sh"), "/tmp/unused",
                        "/nonexistent-kit"], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1].startswith("20 cases; memory floor at 4.237")


def test_configs_timed_pack_both_tokens_of_sixteen_heads_and_spread_tiles_and_grids():
    from kernelsearch.families import get

    cfgs = r3.project_configs(get("mla_decode_mtp"), "fitted", (32, 16, 32768, 64, 2, 0), 6)
    assert {c["BLOCK_H"] for c in cfgs} == {32} and {c["num_warps"] for c in cfgs} == {4}
    assert {(c["BLOCK_N"], c["GRID"]) for c in cfgs} == {(n, g) for n in (64, 32)
                                                         for g in (132, 264, 528)}
    big = r3.project_configs(get("mla_decode"), "splitkv", (8, 128, 131072, 64, 0), 6)
    assert {c["BLOCK_H"] for c in big} == {64} and {c["num_warps"] for c in big} == {8}
    assert r3.project_configs(get("mla_decode"), "no_such_variant", (8, 16, 4096, 64, 0), 6) == []
    # the FP8 sparse kernel aimed at 16 heads is timed with its 16-row tile
    assert "fitted" in r3.PROJECT["mla_sparse_decode_fp8"]
    fp8 = r3.project_configs(get("mla_sparse_decode_fp8"), "fitted",
                             (32, 16, 32768, 64, 2048, 0), 6)
    assert fp8 and {c["BLOCK_H"] for c in fp8} == {16} and {c["num_warps"] for c in fp8} == {4}
