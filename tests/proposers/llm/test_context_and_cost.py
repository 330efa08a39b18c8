"""What the LLM reads (context documents, policy, history, diagnosis) and what it costs."""
import json
from pathlib import Path

import pytest

from tuner.proposers.llm import context as ctx
from tuner.proposers.llm import cost as costs
from tuner.trial import Candidate, GateResult, KernelChoice, Trial

FACTS = Path(__file__).resolve().parents[3] / "docs/readings/h200-baselines-2026-11-29.json"


@pytest.mark.parametrize("name, stem", [
    ("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA B200", "b200"),
    ("NVIDIA L40S", "l40s"), ("NVIDIA GeForce RTX 4090", "rtx4090"),
])
def test_every_gpu_name_maps_to_an_existing_hardware_page(name, stem):
    p = ctx.hardware_file(name)
    assert p is not None and p.stem == stem and p.is_file()
    doc = ctx.hardware_doc(name)
    assert "compute capability" in doc and "SM" in doc and ("TB/s" in doc or "GB/s" in doc)


def test_unknown_gpu_gets_no_invented_features():
    assert ctx.hardware_file("Tesla T4") is None
    assert "do not assume features" in ctx.hardware_doc("Tesla T4")


def test_feature_statements_per_generation():
    h200, l40s, b200 = (ctx.hardware_doc(n) for n in ("H200", "L40S", "B200"))
    assert "wgmma" in h200 and "TMA" in h200 and "sm_90a" in h200
    assert "clock offsets unsupported" in h200
    assert "Lacks" in l40s and "wgmma, TMA" in l40s and "No NVLink" in l40s
    assert "wgmma does not exist on sm_100" in b200 and "tcgen05" in b200
    assert "No NVLink" in ctx.hardware_doc("GeForce RTX 4090")


def test_h200_page_quotes_the_measured_facts():
    facts = json.loads(FACTS.read_text())
    doc = ctx.hardware_doc("H200")
    assert f"{facts['copy_GBps']:.2f}-" in doc  # 4.22 in the baseline run: the range starts there
    best = max(m["TFLOPs"] for m in facts["matmul"])
    assert f"{best:.0f} TFLOP/s" in doc
    l4 = {r["ctx"]: r for r in facts["llama4L_decode"]}
    assert f"{l4[4096]['eager_ms']:.2f} ms eager vs {l4[4096]['graph_ms']:.2f} ms" in doc


def test_model_pages_carry_the_real_designs():
    assert set(ctx.available_models()) >= {"llama-gqa", "deepseek-mla", "deepseek-sparse-attention"}
    mla = ctx.model_docs(["deepseek-mla"])
    assert "512 + 64 = 576" in mla and "kv_lora_rank" in mla and "shared by all heads" in mla
    dsa = ctx.model_docs(["deepseek-sparse-attention"])
    assert "index_topk **2048**" in dsa and "m = **4**" in dsa and "**128** tokens" in dsa
    assert "Lightning indexer" in dsa
    gqa = ctx.model_docs(["llama-gqa"])
    assert "decode_attention: forward(q, k, v)" in gqa
    with pytest.raises(ValueError, match="expected one of"):
        ctx.model_docs(["mamba-9"])


def trial(n, verdict, reason, detail="", cost=None, gain=None, **cand):
    t = Trial(number=n, candidate=Candidate(**cand), verdict=verdict, reason=reason, gain=gain,
              cost=cost or {})
    if detail:
        t.gates.append(GateResult(gate="x", passed=False, code=reason, detail=detail))
    return t


def test_history_shows_each_failure_reason_and_detail():
    ts = [trial(1, "rejected", "policy_denied", "gpu0.power_limit_w: max_step 150 W",
                knobs={"gpu0.power_limit_w": 400}),
          trial(2, "reverted", "holistic_lost", "micro +30% but end to end -45%",
                runtime={"cuda_graphs": False}, gain=-0.45),
          trial(3, "rejected", "guard_failed", "torch call outside kernels | rms_norm",
                kernel=KernelChoice(family="rmsnorm", variant="llm", config={"BLOCK": 1024}))]
    md = ctx.history_section(ts)
    assert "| 1 | knobs {\"gpu0.power_limit_w\": 400} | rejected | policy_denied |" in md
    assert "holistic_lost | -45.00% | micro +30%" in md
    assert "kernel rmsnorm/llm" in md and "torch call outside kernels / rms_norm" in md  # | escaped
    assert md.count("\n| ") == 4  # header and three rows
    assert len(ctx.history_section(ts, limit=1).splitlines()) == 5


def test_diagnosis_goes_into_the_user_message():
    import torch

    from tuner.workloads.diagnose import diagnose

    torch.set_num_threads(1)
    d = diagnose("tiny", "decode", batch=1, ctx=16, steps=2, device="cpu",
                 ceilings={"flops_per_s": 5e10, "bytes_per_s": 2e10, "source": "t"})
    msg = ctx.user_message([], d, ("host",))
    assert msg.startswith("## Diagnosis: where the time goes")
    assert "| aten::" in msg and "launch-bound" in msg and msg.rstrip().endswith("one tool call.")


def test_prices_and_costs():
    assert costs.price_for("claude-opus-5-5")[:2] == (4.0, 20.0)
    assert costs.price_for("claude-opus-5-20260724")[:2] == (5.0, 25.0)  # prefix, not opus-5-5
    assert costs.price_for("some-other-model") is None
    c = costs.usage_cost("some-other-model", {"input_tokens": 10, "output_tokens": 5})
    assert "usd" not in c and c["input_tokens"] == 10
    c = costs.usage_cost("claude-sonnet-5-5", {"input_tokens": 1_000_000, "output_tokens": 100_000,
                                               "cache_read_input_tokens": 1_000_000})
    assert c["usd"] == pytest.approx(2.0 + 1.0 + 0.2)


def test_price_override_by_environment(monkeypatch):
    monkeypatch.setenv("METALTUNE_LLM_PRICE", "1,2")
    assert costs.usage_cost("x", {"input_tokens": 1e6, "output_tokens": 1e6})["usd"] == pytest.approx(3.0)


def test_spend_per_kept_change():
    led = costs.Ledger()
    out = []
    for usd, kept in ((0.10, False), (0.20, False), (0.30, True), (0.05, True), (0.5, False)):
        led.charge({"usd": usd, "requests": 1, "input_tokens": 100})
        out.append(led.trial_cost({"usd": usd}, kept))
    assert out[2]["kept_change_usd"] == pytest.approx(0.60) and out[2]["kept_change_requests"] == 3
    assert out[3]["kept_change_usd"] == pytest.approx(0.05)
    assert "kept_change_usd" not in out[4] and out[4]["run_usd"] == pytest.approx(1.15)
    ts = [trial(i, "kept" if k else "reverted", "improved" if k else "within_noise",
                cost={"usd": u, "requests": 1}, gain=0.1 if k else None)
          for i, (u, k) in enumerate(((0.1, False), (0.2, True), (0.3, False), (0.4, True)), 1)]
    per = costs.per_kept_change(ts)
    assert [p["trial"] for p in per] == [2, 4]
    assert [round(p["usd"], 2) for p in per] == [0.3, 0.7]
