"""The judge draws every input rank a family takes (issue 33, item 10): the row-wise families
are called by a model with [batch, seq, hidden] (and [hidden] for one row), while the judge's
inputs are [rows, cols]. A candidate that unpacks `n_rows, n_cols = x.shape` is rejected by
`metaltune kernel check`, by the rule naming the exception, instead of accepted and then
raising in the model; one that takes any rank is still accepted."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GOOD = json.loads((ROOT / "tests/proposers/llm/recordings/good_kernel.json").read_text())[
    "content"][-1]["input"]
ANY_RANK = """    n_cols = x.shape[-1]
    x2 = x if x.is_contiguous() else x.contiguous()
    n_rows = x.numel() // n_cols
"""
RANK_2_ONLY = GOOD["source"].replace(ANY_RANK, """    n_rows, n_cols = x.shape
    x2 = x if x.is_contiguous() else x.contiguous()
""")


def _check(source: str, tmp_path: Path) -> dict:
    cand = tmp_path / "cand.py"
    cand.write_text(source)
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRITON_INTERPRET="1",
               KERNELSEARCH_SANDBOX_USER="none")
    p = subprocess.run([sys.executable, "-m", "tuner", "--state-dir", str(tmp_path / "st"),
                        "kernel", "check", "--family", "rmsnorm", "--candidate", str(cand),
                        "--device", "cpu", "--config", json.dumps(GOOD["config"]),
                        "--no-timing", "--json"],
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert "Traceback" not in p.stderr, p.stderr[-2000:]
    return {"rc": p.returncode, **json.loads(p.stdout)}


def test_a_candidate_that_takes_only_rank_2_is_rejected(tmp_path):
    assert RANK_2_ONLY != GOOD["source"]
    d = _check(RANK_2_ONLY, tmp_path)
    assert d["rc"] == 1 and d["verdict"] == "rejected", d
    assert (d["stage"], d["code"], d["rule"]) == ("correctness", "crashed",
                                                  "exception:ValueError"), d
    assert "unpack" in d["detail"]


def test_a_candidate_that_takes_any_rank_is_accepted(tmp_path):
    d = _check(GOOD["source"], tmp_path)
    assert d["rc"] == 0 and d["verdict"] == "accepted", d


@pytest.mark.parametrize("family", ["softmax", "rmsnorm", "swiglu", "rope", "matmul",
                                    "decode_attention", "mla_decode"])
def test_the_judge_plans_every_rank_a_family_takes(family):
    """The row-wise families: ranks 1, 3 and 4 besides the 2 make_inputs gives, after the
    boundary shapes, each keeping the problem's shape; families that take one rank only get
    none."""
    import torch

    from kernelsearch.families import get
    from kernelsearch.harness import ranks
    from kernelsearch.harness.draws import dispatch_runs

    fam = get(family)
    shapes = [tuple(s) for s in fam.tiny_shapes[:2]]
    after = ranks.after(fam, shapes, [shapes[1]])
    assert after[0] == (shapes[1], None)  # the boundary shapes first, as before
    extra = after[1:]
    rowwise = family in ("softmax", "rmsnorm", "swiglu")
    assert [r for _, r in extra] == ([1, 3, 4] if rowwise else [])
    for shape, rank in extra:
        args = fam.make_inputs(shape, fam.dtypes[0], "cpu", torch.Generator().manual_seed(0))
        new, note = ranks.reshape(fam, args, rank, dispatch_runs)
        assert new[0].dim() == rank and note == [f"rank {rank} {tuple(new[0].shape)}"]
        assert fam.shape_of(*new) == fam.shape_of(*args)
