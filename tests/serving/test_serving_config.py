"""The serving workload's config (tuner.workloads.serving.config) and engine settings
(engines.py): what a user writes, what reaches the server, and one clear line for bad input."""
from __future__ import annotations

import pytest

from tests.cli.test_usage_errors import assert_one_line, metaltune
from tuner.errors import BadInput
from tuner.workloads.serving import engines
from tuner.workloads.serving.bench import bench_args
from tuner.workloads.serving.config import load
from tuner.workloads.serving.result import to_measurement
from tuner.workloads.serving.workload import ServingWorkload


def test_inline_pairs_and_a_toml_file_give_the_same_config(tmp_path):
    inline = load("model=/m,engine_python=/e/python,concurrency=1+4+16,ttft_ms=500,tpot_ms=50,"
                  "flags=--dtype bfloat16 --max-model-len 1024,env.VLLM_CPU_KVCACHE_SPACE=1,"
                  "setting.max-num-seqs=32,setting.enforce-eager=true")
    f = tmp_path / "serve.toml"
    f.write_text('model = "/m"\nengine_python = "/e/python"\nconcurrency = [1, 4, 16]\n'
                 'ttft_ms = 500\ntpot_ms = 50\nflags = ["--dtype", "bfloat16", "--max-model-len", "1024"]\n'
                 '[env]\nVLLM_CPU_KVCACHE_SPACE = "1"\n[settings]\nmax-num-seqs = 32\nenforce-eager = true\n')
    assert load(str(f)) == inline
    assert inline.concurrency == [1, 4, 16] and inline.sizes() == ["c=1", "c=4", "c=16"]
    assert inline.settings == {"max-num-seqs": 32, "enforce-eager": True}  # typed by the registry
    y = tmp_path / "serve.yaml"
    y.write_text("model: /m\nengine_python: /e/python\nattach: http://10.0.0.5:8000/\n")
    assert load(str(y)).attach == "http://10.0.0.5:8000"


def test_engine_settings_reach_the_server_as_flags_and_environment_and_defaults_pass_nothing():
    wl = ServingWorkload(load("model=/m,engine_python=/p,flags=--dtype bfloat16"))
    assert wl.launch() == (["--dtype", "bfloat16"], {})  # the user's own command line
    wl.configure({"max-num-seqs": 8, "enforce-eager": True, "optimization-level": 0,
                  "VLLM_CPU_KVCACHE_SPACE": 2, "kv-cache-dtype": "fp8"})
    flags, env = wl.launch()
    assert flags == ["--dtype", "bfloat16", "--max-num-seqs", "8", "--kv-cache-dtype", "fp8",
                     "--optimization-level", "0", "--enforce-eager"]
    assert env == {"VLLM_CPU_KVCACHE_SPACE": "2"}
    dims = wl.runtime_dims()
    for name in ("max-num-seqs", "max-num-batched-tokens", "block-size", "kv-cache-dtype",
                 "optimization-level", "enforce-eager", "VLLM_CPU_KVCACHE_SPACE",
                 "VLLM_CPU_OMP_THREADS_BIND"):
        assert wl.runtime_settings()[name] in dims[name]  # the incumbent is a point of the space
    with pytest.raises(ValueError, match="max-num-seqs"):
        wl.validate_runtime({"max-num-seqs": 7})
    assert ServingWorkload(load("model=/m,engine_python=/p,search=enforce-eager+max-num-seqs")
                           ).runtime_dims() == {"enforce-eager": [False, True],
                                                "max-num-seqs": list(engines.VLLM.dims()["max-num-seqs"])}
    attach = ServingWorkload(load("model=m,attach=http://127.0.0.1:9"))
    assert attach.runtime_dims() == {}
    with pytest.raises(ValueError, match="attach"):
        attach.validate_runtime({"enforce-eager": True})


def test_the_bench_client_is_asked_for_json_with_the_slos_as_goodput():
    cfg = load("model=/m,engine_python=/p,ttft_ms=300,tpot_ms=40,input_len=64,output_len=32")
    a = bench_args(cfg, "http://127.0.0.1:1")
    assert a[a.index("--goodput") + 1:a.index("--goodput") + 3] == ["ttft:300", "tpot:40"]
    assert a[a.index("--random-input-len") + 1] == "64" and "--max-concurrency" not in a


def test_bench_results_become_per_size_throughput_goodput_and_latencies():
    def run(c, tput, good, ttft):
        return {"concurrency": c, "completed": 8, "failed": 0, "output_throughput": tput,
                "request_goodput": good, "mean_ttft_ms": ttft, "p99_ttft_ms": ttft * 2}
    runs = [run(1, 100.0, 2.0, 10.0), run(4, 400.0, 6.0, 30.0), run(1, 120.0, 3.0, 12.0),
            run(4, 300.0, 5.0, 40.0)]
    m = to_measurement(runs, watts={"c=1": 50.0, "c=4": 0.0}, energy_source="nvml_energy_counter")
    assert m.per_size == {"c=1": 110.0, "c=4": 350.0}
    assert m.per_size_goodput == {"c=1": 2.5, "c=4": 5.5}
    assert m.extra["per_size_samples"] == {"c=1": [100.0, 120.0], "c=4": [400.0, 300.0]}
    assert m.extra["per_size_goodput_samples"] == {"c=1": [2.0, 3.0], "c=4": [6.0, 5.0]}
    assert m.extra["latency_ms"]["c=4"] == {"mean_ttft_ms": 35.0, "p99_ttft_ms": 70.0}
    assert m.per_size_tok_per_j == {"c=1": 110.0 / 50.0} and m.energy_source == "nvml_energy_counter"
    assert to_measurement(runs).energy_source == "" and not to_measurement(runs).per_size_tok_per_j


@pytest.mark.parametrize("args, field", [
    ("", "expected vllm:<config"),
    ("model=/m,engine_python=/p,concurrency=4+4", "concurrency: a non-empty list"),
    ("model=/m,engine_python=/p,setting.block-size=7", "setting block-size: expected one of"),
    ("model=/m,engine_python=/p,search=bogus", "search: vllm has no setting 'bogus'"),
    ("model=/m,engine_python=/p,frob=1", "frob: Extra inputs"),
    ("model=/m,engine_python=/p,engine=sglang", "engine: expected one of"),
    ("model=/m,engine_python=/p,attach=ftp://h", "attach: an http"),
    ("engine_python=/p", "model: a model dir"),
    ("model=/m,ttft_ms", "expected key=value"),
])
def test_bad_inline_input_is_one_bad_input_naming_the_field(args, field, monkeypatch):
    monkeypatch.delenv("METALTUNE_VLLM_PYTHON", raising=False)
    with pytest.raises(BadInput, match=field.replace("(", r"\(").replace("[", r"\[")):
        load(args)


def test_bad_files_are_one_line_naming_the_file(tmp_path, monkeypatch):
    monkeypatch.delenv("METALTUNE_VLLM_PYTHON", raising=False)
    bad = tmp_path / "serve.toml"
    bad.write_text("model = \n")
    with pytest.raises(BadInput, match=f"{bad}: not valid TOML"):
        load(str(bad))
    y = tmp_path / "serve.yaml"
    y.write_text("- a list\n")
    with pytest.raises(BadInput, match=f"{y}: expected a table"):
        load(str(y))
    with pytest.raises(BadInput, match="engine_python: required"):
        load("model=/m")


def test_the_cli_answers_a_bad_serving_config_with_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "serve.toml"
    bad.write_text('model = "/m"\nengine_python = "/p"\nconcurrency = []\n')
    assert metaltune(["sim", "init", str(tmp_path / "sim")], tmp_path).returncode == 0
    r = metaltune(["--backend", "sim", "--sim-root", str(tmp_path / "sim"), "search", "mixed",
                   "--knob", "none", "--workload", f"vllm:{bad}", "--budget", "1"], tmp_path)
    assert_one_line(r, rf"{bad}: concurrency: a non-empty list")
    assert not (tmp_path / "state" / "trials.db").exists()


def test_a_users_domain_replaces_the_registrys_and_must_hold_the_default():
    cfg = load("model=/m,engine_python=/p,domains.kv-cache-memory-bytes=default+65536,"
               "domains.enforce-eager=false")
    wl = ServingWorkload(cfg)
    assert wl.runtime_dims()["kv-cache-memory-bytes"] == ["default", 65536]
    assert wl.runtime_dims()["enforce-eager"] == [False]
    wl.configure({"kv-cache-memory-bytes": 65536})
    assert wl.launch()[0] == ["--kv-cache-memory-bytes", "65536"]
    with pytest.raises(BadInput, match="domains.max-num-seqs: expected a list holding the start value 'default'"):
        load("model=/m,engine_python=/p,domains.max-num-seqs=8+16")
