"""examples/hf_user_decode.py, the plain user script that applies a kept table with `patch`:
it runs as a user would run it (a subprocess, a table file) and patches what the table covers."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hfhelpers import covering_table

pytest.importorskip("transformers")
REPO = Path(__file__).resolve().parents[2]


def _run(tmp_path, table: str) -> dict:
    out = tmp_path / f"{Path(table).stem}.json"
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    p = subprocess.run([sys.executable, str(REPO / "examples/hf_user_decode.py"), "--table", table,
                        "--config", "tiny-llama", "--layers", "1", "--batch", "2", "--ctx", "20",
                        "--chunk", "16", "--steps", "2", "--device", "cpu", "--no-compile",
                        "--json", str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "decode tokens/s" in p.stdout
    return json.loads(out.read_text())


def test_the_user_script_patches_what_the_kept_table_covers(tmp_path):
    from transformers import AutoConfig

    from tuner.workloads.hf import PRESETS

    geometry = {k: v for k, v in PRESETS["tiny-llama"].items() if k != "dtype"}
    table = covering_table(AutoConfig.for_model(**geometry))
    # a table file as the search writes it (float32 decode attention is CPU-interpreter only and
    # refused by the file format, so the file holds the other families)
    table.entries = [e for e in table.entries if e.family != "decode_attention"]
    for e in table.entries:  # the file format takes a config only from the family's space
        if e.family == "swiglu":
            e.config = {"BLOCK": 256, "num_warps": 1}
    path = tmp_path / "kept.json"
    table.save(path)
    got = _run(tmp_path, str(path))
    assert got["patched"].get("rmsnorm") and got["patched"].get("mlp") and got["patched"].get("rope")
    assert not got["patched"].get("attention")
    assert got["decode_tokens_per_s"]["decode@ctx20,b2"] > 0
    plain = _run(tmp_path, "none")
    assert not any(plain["patched"].values())
