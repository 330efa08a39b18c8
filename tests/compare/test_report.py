"""The comparison report built from child documents: ratios, intervals, verdicts, differing
facts, and the files (JSON, Markdown, self-contained HTML, PNG)."""
import json
import random

from tuner.compare import report


def _run(facts, **metrics):
    ms = []
    for name, (unit, hib, samples) in metrics.items():
        ms.append({"name": name, "unit": unit, "higher_is_better": hib, "samples": samples,
                   "params": {}, "skipped": None, "error": None})
    return {"hostname": "h", "backend": "real", "facts": facts, "metrics": ms}


def _noisy(v, n=7, cv=0.01, seed=0):
    rng = random.Random(seed)
    return [v * rng.gauss(1, cv) for _ in range(n)]


def _pair():
    bare = _run({"virtualisation": "bare-metal", "hypervisor": None, "gpu_name": "NVIDIA H200",
                 "gpu0_relaxed_ordering": True, "evidence": ["DMI: Supermicro"]},
                gemm_bf16_tflops=("TFLOP/s", True, _noisy(700, seed=1)),
                launch_eager_us=("us/kernel", False, _noisy(4.3, seed=2)),
                h2d_pageable_gbps=("GB/s", True, _noisy(17.8, seed=3)))
    vm = _run({"virtualisation": "vm", "hypervisor": "firecracker", "gpu_name": "NVIDIA H200",
               "gpu0_relaxed_ordering": False, "evidence": ["no DMI"]},
              gemm_bf16_tflops=("TFLOP/s", True, _noisy(700, seed=4)),
              launch_eager_us=("us/kernel", False, _noisy(5.6, seed=5)),
              h2d_pageable_gbps=("GB/s", True, _noisy(10.7, seed=6)))
    return bare, vm


def test_ratios_verdicts_and_differing_facts():
    bare, vm = _pair()
    rep = report.build([bare, vm], ["bare", "vm"])
    by = {m["name"]: m["comparisons"][0] for m in rep["metrics"]}
    assert by["gemm_bf16_tflops"]["verdict"] == "within noise"
    lat = by["launch_eager_us"]
    assert 1.25 < lat["ratio"] < 1.35 and lat["low"] > 1.0
    assert lat["verdict"].startswith("worse by")          # higher latency is worse
    h2d = by["h2d_pageable_gbps"]
    assert 0.55 < h2d["ratio"] < 0.65 and h2d["high"] < 1.0 and h2d["verdict"].startswith("worse")
    assert set(rep["facts_differing"]) == {"virtualisation", "hypervisor", "gpu0_relaxed_ordering"}
    assert "gpu_name" in [f["fact"] for f in rep["facts"]]


def test_missing_or_skipped_metric_is_not_comparable():
    bare, vm = _pair()
    vm["metrics"][1]["samples"] = []
    vm["metrics"][1]["skipped"] = "no CUDA device"
    rep = report.build([bare, vm], ["bare", "vm"])
    lat = next(m for m in rep["metrics"] if m["name"] == "launch_eager_us")
    assert lat["comparisons"][0]["verdict"] == "not comparable"
    assert "skipped: no CUDA device" in report.markdown(rep)


def test_files_are_written_and_html_is_self_contained(tmp_path):
    bare, vm = _pair()
    rep = report.build([bare, vm], ["bare", "vm"])
    files = report.write(rep, [bare, vm], tmp_path)
    assert set(files) == {"report.json", "report.md", "report.html", "metrics.png", "ratios.png"}
    for png in ("metrics.png", "ratios.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    doc = json.loads((tmp_path / "report.json").read_text())
    assert doc["raw"][1]["facts"]["hypervisor"] == "firecracker"
    html = (tmp_path / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 2
    assert "http://" not in html and "https://" not in html and "<script" not in html
    md = (tmp_path / "report.md").read_text()
    assert "| launch_eager_us |" in md and "](ratios.png)" in md
