"""The vLLM plugin's logic that needs no engine (the project's venv): what a captured CUDA graph
pins per batch size, the settings a user gives through the environment (a bad one stops the
engine process with one line and exit status 2), and the count file."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernelsearch.integrations.vllm import counter, graphs
from kernelsearch.integrations.vllm.settings import COUNT_ENV, STORE_ENV, TABLE_ENV, PluginError, read
from kernelsearch.table import DispatchTable, Entry


def _table() -> DispatchTable:
    return DispatchTable([
        Entry("rmsnorm", "bfloat16", {"cols": 4096}, {"rows": [1, 64]}, "row", {"num_warps": 4}),
        Entry("rmsnorm", "bfloat16", {"cols": 4096}, {"rows": [65, 512]}, "looped",
              {"BLOCK": 1024, "num_warps": 8}),
        # MLA decode on 128 heads, page 64: flashdec-like split kernel certified to 32k context
        Entry("mla_decode", "bfloat16", {"H": 128, "P": 64}, {"B": [1, 64], "L": [64, 32768]},
              "splitkv", {"BLOCK_N": 64}),
    ], device="NVIDIA H200")


def test_each_captured_batch_size_pins_the_entry_covering_it():
    plan = graphs.capture_plan(_table(), "rmsnorm", "bfloat16", {"cols": 4096},
                               [512, 1, 8, 64, 65, 1024, 8])
    got = [(c.batch, c.how, c.variant) for c in plan]
    assert got == [(1, "table", "row"), (8, "table", "row"), (64, "table", "row"),
                   (65, "table", "looped"), (512, "table", "looped"),
                   (1024, "torch", None)]  # past every certified range: the fallback
    assert plan[3].config == {"BLOCK": 1024, "num_warps": 8}
    assert plan[0].dims == {"cols": 4096, "rows": 1}
    assert graphs.summary(plan) == ("1-64: row {'num_warps': 4}; "
                                    "65-512: looped {'BLOCK': 1024, 'num_warps': 8}; 1024: torch")


def test_an_attention_graph_is_chosen_at_the_cache_capacity_not_the_current_context():
    t = _table()
    inside = graphs.capture_plan(t, "mla_decode", "bfloat16", {"H": 128, "P": 64},
                                 [1, 32, 128], max_context=32768)
    assert [(c.batch, c.how) for c in inside] == [(1, "table"), (32, "table"), (128, "torch")]
    assert inside[0].dims["L"] == 32768
    # a graph serving up to 128k would replay the kernel past its certified 32k: not pinned
    past = graphs.capture_plan(t, "mla_decode", "bfloat16", {"H": 128, "P": 64}, [1, 32],
                               max_context=131072)
    assert [c.how for c in past] == ["torch", "torch"]
    with pytest.raises(ValueError, match="cache capacity"):
        graphs.capture_plan(t, "mla_decode", "bfloat16", {"H": 128, "P": 64}, [1])
    with pytest.raises(ValueError, match="no batch dim"):
        graphs.graph_dims("nope", {}, 1)


def test_the_plugin_is_off_without_a_table_and_names_a_bad_setting(tmp_path):
    off = read({})
    assert off.table is None and TABLE_ENV in off.why_off
    shipped = read({TABLE_ENV: "shipped"})  # no GPU here: nothing shipped for it, off
    assert shipped.table is None and "no table is shipped" in shipped.why_off
    t = tmp_path / "t.json"
    t.write_text(json.dumps(_table().to_dict()))
    on = read({TABLE_ENV: str(t), COUNT_ENV: str(tmp_path / "c.jsonl")})
    assert on.table == t and on.count == tmp_path / "c.jsonl"
    for env, what in (({TABLE_ENV: str(tmp_path / "missing.json")}, "no such file"),
                      ({TABLE_ENV: str(t), STORE_ENV: str(tmp_path / "none")}, "not a folder"),
                      ({TABLE_ENV: str(t), COUNT_ENV: str(tmp_path / "x" / "c")}, "folder")):
        with pytest.raises(PluginError, match=what) as e:
            read(env)
        assert "\n" not in str(e.value) and list(env)[-1] in str(e.value)


def test_counts_are_per_process_totals_and_a_planted_symlink_is_not_followed(tmp_path):
    p = tmp_path / "c.jsonl"
    counter.append(p, {"event": "loaded", "pid": 1})
    counter.append(p, {"event": "calls", "pid": 1, "calls": {"rmsnorm": 3}})
    counter.append(p, {"event": "calls", "pid": 1, "calls": {"rmsnorm": 7, "swiglu": 2}})
    counter.append(p, {"event": "calls", "pid": 2, "calls": {"rmsnorm": 5}})
    with open(p, "a") as f:
        f.write("{torn\n")
    assert counter.totals(p) == {"rmsnorm": 12, "swiglu": 2}
    assert oct(p.stat().st_mode & 0o777) == "0o600"
    target = tmp_path / "elsewhere"
    target.write_text("")
    link = tmp_path / "link.jsonl"
    link.symlink_to(target)
    with pytest.raises(OSError):
        counter.append(link, {"event": "loaded", "pid": os.getpid()})
    assert target.read_text() == ""


ROOT = Path(__file__).resolve().parents[2]


def test_a_bad_setting_stops_the_engine_process_with_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"version": 1, "entries": [{"family": "rmsnorm"}]}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("METALTUNE_VLLM_")}
    for value, what in ((str(tmp_path / "missing.json"), "no such file"),
                        (str(bad), "dtype")):
        p = subprocess.run([sys.executable, "-c",
                            "from kernelsearch.integrations.vllm import register; register()"],
                           cwd=ROOT, env=env | {TABLE_ENV: value}, capture_output=True,
                           text=True, timeout=60)
        assert p.returncode == 2, p.stderr
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
        assert lines[0].startswith("metaltune vLLM plugin: METALTUNE_VLLM_TABLE") and what in lines[0]
    good = tmp_path / "good.json"
    good.write_text(json.dumps(_table().to_dict()))
    p = subprocess.run([sys.executable, "-c",
                        "from kernelsearch.integrations.vllm import register; register()"],
                       cwd=ROOT, env=env | {TABLE_ENV: str(good), "KERNELSEARCH_CANARY_RATE": "abc"},
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.strip() == (
        "metaltune vLLM plugin: KERNELSEARCH_CANARY_RATE='abc': expected a number in [0, 1]")


def test_a_table_tuned_on_another_gpu_leaves_the_engine_as_it_is(tmp_path, monkeypatch):
    import kernelsearch.integrations.vllm as plugin
    from kernelsearch import dispatch

    t = tmp_path / "h200.json"
    t.write_text(json.dumps(_table().to_dict()))  # device "NVIDIA H200"; this host has none
    monkeypatch.setenv(TABLE_ENV, str(t))
    monkeypatch.delenv(COUNT_ENV, raising=False)
    monkeypatch.setattr(plugin, "_state", {})
    plugin.register()  # no vLLM in this venv: it must stop before importing vLLM's layers
    assert "tuned and verified on NVIDIA H200" in plugin._state["off"]
    assert dispatch.installed() is None
