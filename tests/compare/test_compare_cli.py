"""`metaltune compare` as a user runs it: bad targets refused (exit 2), a real local run through
the child process, and the all-reduce code path on CPUs (gloo) where no second GPU exists."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def mt(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "tuner", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=timeout)


@pytest.mark.parametrize("target,needle", [
    ("sim:///nonexistent/dir", "host.json"),
    ("ssh://", "ssh://user@host"),
    ("ssh://root@h:99999", "port"),
    ("ftp://x", "expected 'local'"),
    ("ssh://root@h?colour=red", "unknown option"),
])
def test_bad_target_is_bad_input(target, needle, tmp_path):
    r = mt("compare", "local", target, "--report", str(tmp_path / "rep"))
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr and r.stderr.count("\n") == 1
    assert not (tmp_path / "rep").exists()


def test_unknown_metric_is_bad_input():
    r = mt("compare", "local", "--only", "gemm_bf16_tflops,warp_speed")
    assert r.returncode == 2 and "warp_speed" in r.stderr


def test_local_run_measures_host_memory_and_reads_facts(tmp_path):
    r = mt("compare", "local", "--quick", "--repeats", "3", "--only", "host_mem_bw_gbps,gemm_bf16_tflops",
           "--json", "--report", str(tmp_path))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    m = {x["name"]: x for x in doc["metrics"]}
    hm = m["host_mem_bw_gbps"]["targets"][0]
    assert hm["summary"]["n"] == 3 and 0.5 < hm["summary"]["median"] < 2000
    gemm = m["gemm_bf16_tflops"]["targets"][0]
    import torch

    if not torch.cuda.is_available():
        assert gemm["skipped"] == "no CUDA device"
    facts = {f["fact"]: f["values"][0] for f in doc["facts"]}
    assert facts["virtualisation"] in ("vm", "bare-metal") and facts["cpu_count"] >= 1
    assert (tmp_path / "report.html").is_file() and (tmp_path / "metrics.png").is_file()


def test_allreduce_bus_bandwidth_code_path_on_cpus():
    from tuner.compare.suite import Config, nccl_allreduce

    m = nccl_allreduce(Config(repeats=2, quick=True), cuda=False, backend="gloo", world=2)
    assert m.params["world"] == 2 and len(m.samples) == 2
    assert all(x > 0 for x in m.samples)
