"""The LLM proposer end to end: the real anthropic SDK over a fake HTTP transport serving
recorded Messages API replies (tests/proposers/llm/recordings), the real search loop, store, gates, the
holistic workload and the kernel harness. No network: httpx2.MockTransport answers every request.

The replies are in the Messages API's wire format (thinking, text and tool_use blocks, usage with
cache fields); they were written for these tests, not captured from a live session.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import httpx2
import pytest

from tuner.proposers import make
from tuner.proposers.base import Dim, ProposalRejected, SearchSpace
from tuner.search import gates as G
from tuner.search.loop import run as run_loop
from tuner.search.runtime import RuntimeEvaluator
from tuner.search.store import TrialStore
from tuner.workloads.llama import LlamaWorkload, Runtime

REC = Path(__file__).parent / "recordings"
KEY = "sk-ant-test-0123456789abcdef-SECRET"
EMU = {"emulate_launch_us": 100.0, "emulate_capture_us": 0.0}  # see tests/workloads


class FakeAPI:
    """Serves replies in order; keeps every request (method, path, headers, JSON body)."""

    def __init__(self, *replies):
        self.replies = list(replies)
        self.requests: list[dict] = []

    def handler(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append({"path": request.url.path, "headers": dict(request.headers),
                              "body": json.loads(request.content)})
        reply = self.replies.pop(0)
        if isinstance(reply, str) and reply.endswith(".json"):
            return httpx2.Response(200, json=json.loads((REC / reply).read_text()))
        status, body = reply
        if isinstance(body, (dict, list)):
            return httpx2.Response(status, json=body)
        return httpx2.Response(status, content=body.encode(), headers={"content-type": "application/json"})


def space():
    return SearchSpace([Dim("gpu0.power_limit_w", [500, 600, 700])])


def proposer(api: FakeAPI, **kw):
    http = httpx2.Client(transport=httpx2.MockTransport(api.handler))
    return make("llm", space(), seed=0, api_key=KEY, base_url="http://127.0.0.1:9",
                http_client=http, max_retries=0, gpu="NVIDIA H200", **kw)


class CountingWorkload(LlamaWorkload):
    measured = 0

    def measure(self, repeats=5, timeout_s=None):
        CountingWorkload.measured += 1
        return super().measure(repeats, timeout_s)


@pytest.fixture
def workload():
    import torch

    torch.set_num_threads(1)
    CountingWorkload.measured = 0
    return CountingWorkload("tiny", contexts=[16, 64], decode_batches=[2], device="cpu", prefill=False)


def evaluator(wl, **kw):
    return RuntimeEvaluator(wl, incumbent={**EMU, "cuda_graphs": False}, rounds=2, repeats=3,
                            validate=Runtime.from_dict, **kw)


def test_good_answer_is_measured_and_kept_with_its_cost(tmp_path, workload, caplog):
    caplog.set_level(logging.DEBUG)  # the SDK's and ours: the key must not appear even here
    api = FakeAPI("good_host.json")
    p = proposer(api)
    store = TrialStore(tmp_path / "trials.db")
    res = run_loop(p, evaluator(workload), store, "r1", budget=1)
    t = res.trials[0]
    assert (t.verdict, t.reason) == ("kept", "improved"), t.gates
    assert t.candidate.runtime == {"cuda_graphs": True} and t.candidate.proposer == "llm"
    assert t.gain > 0.3 and set(t.measurements["holistic"]["per_size"]) == {
        "decode@ctx16,b2", "decode@ctx64,b2"}
    # cost: opus-5-5 at $4 / $20 per MTok, cache writes $5
    usd = (6012 * 4 + 388 * 20 + 5800 * 5) / 1e6
    assert t.cost["input_tokens"] == 6012 and t.cost["output_tokens"] == 388
    assert t.cost["usd"] == pytest.approx(usd) and t.cost["kept_change_usd"] == pytest.approx(usd)
    stored = store.list(run_id="r1")[0]
    assert stored.cost["usd"] == pytest.approx(usd) and stored.verdict == "kept"
    # what was sent: the model, both context layers, the policy, the tool schema
    req = api.requests[0]
    assert req["path"] == "/v1/messages"
    assert KEY in (req["headers"].get("x-api-key", "") + req["headers"].get("authorization", ""))
    body = req["body"]
    assert body["model"] == "claude-opus-5-5"
    assert [t["name"] for t in body["tools"]] == ["propose_host_candidate"]
    assert body["tools"][0]["input_schema"]["required"] == ["rationale"]
    system = body["system"][0]["text"]
    assert "H200" in system and "4.8 TB/s" in system and "grouped-query" in system.lower()
    assert "Prohibitions" in system and "gpu0.power_limit_w" in system and "cuda_graphs" in system
    assert "No trials yet" in body["messages"][0]["content"]
    # the key is nowhere but the auth header
    assert KEY not in caplog.text and KEY not in repr(p) and KEY not in json.dumps(p.last_prompt)
    assert KEY not in stored.model_dump_json()


@pytest.mark.parametrize("reply, detail", [
    ("text_only.json", "without a tool call"),
    ("bad_schema.json", "does not fit its schema"),
    ((200, "{this is not json"), "not JSON"),
    ((200, {"id": "msg_x", "type": "message", "role": "assistant", "model": "claude-opus-5-5",
            "content": [{"type": "tool_use", "id": "t", "name": "propose_host_candidate",
                         "input": {"knobs": {"gpu0.power_limit_w": 650}, "rationale": "cut"}}],
            "stop_reason": "max_tokens", "usage": {"input_tokens": 10, "output_tokens": 16000}}),
     "cut off"),
])
def test_malformed_answers_become_rejected_trials(tmp_path, workload, reply, detail):
    api = FakeAPI(reply, "good_host.json")
    p = proposer(api)
    res = run_loop(p, evaluator(workload), TrialStore(tmp_path / "t.db"), "r", budget=2)
    bad, good = res.trials
    assert (bad.verdict, bad.reason) == ("rejected", "malformed")
    assert bad.gates[0].gate == "proposal" and detail in bad.gates[0].detail
    # the failure is in the next prompt, so the model can learn from it
    nxt = api.requests[1]["body"]["messages"][0]["content"]
    assert "| 1 |" in nxt and "malformed" in nxt and detail.split()[0] in nxt
    assert (good.verdict, good.reason) == ("kept", "improved")
    # tokens of the bad answer are still charged to that trial (when the reply had usage)
    if reply == "text_only.json":
        assert bad.cost["output_tokens"] == 40 and good.cost["kept_change_requests"] == 2


def test_out_of_policy_answer_is_rejected_by_the_policy_gate(tmp_path, workload):
    from safety.policy import load_default

    pol = load_default()

    def check(name, old, new):
        rule = pol.forbidden_by(name)
        if rule:
            return f"{name} is forbidden by the policy ({rule})"
        return None if pol.rule_for(name) else f"{name}: no policy rule allows it"

    api = FakeAPI("out_of_policy.json")
    ev = evaluator(workload, extra_gates=[G.policy(check, lambda: {})])
    res = run_loop(proposer(api), ev, TrialStore(tmp_path / "t.db"), "r", budget=1)
    t = res.trials[0]
    assert (t.verdict, t.reason) == ("rejected", "policy_denied")
    assert "NVreg_EnablePCIERelaxedOrderingMode" in t.gates[-1].detail
    assert CountingWorkload.measured == 0  # nothing ran


class KernelEvaluator:
    """Kernel candidates judged by kernelsearch's harness (guard -> correctness -> timing)."""

    def gates(self):
        return []

    def evaluate(self, c, trial):
        from kernelsearch.harness import check

        v = check(c.kernel.family, c.kernel.source, c.kernel.config, device="cpu", timeout_s=120)
        trial.gates.append(G.GateResult(gate=v.stage, passed=v.accepted, code=v.code,
                                        detail=f"{v.rule}: {v.detail}"))
        trial.verdict, trial.reason = ("kept", "improved") if v.accepted else ("rejected", v.code)
        return trial


def test_a_cheating_kernel_is_rejected_by_the_harness(tmp_path):
    pytest.importorskip("kernelsearch.harness.runner")
    api = FakeAPI("cheating_kernel.json")
    p = proposer(api, kinds=("kernel",))
    body_tools = None
    res = run_loop(p, KernelEvaluator(), TrialStore(tmp_path / "t.db"), "r", budget=1)
    t = res.trials[0]
    body_tools = [x["name"] for x in api.requests[0]["body"]["tools"]]
    assert body_tools == ["propose_kernel_candidate"]
    assert "rmsnorm" in api.requests[0]["body"]["system"][0]["text"]
    assert t.candidate.kernel.family == "rmsnorm" and t.candidate.kernel.variant == "llm"
    assert (t.verdict, t.reason) == ("rejected", "guard_failed"), t.gates
    assert "rms_norm" in t.gates[-1].detail or "torch" in t.gates[-1].detail


def test_unoffered_family_and_unknown_tool_are_malformed():
    reply = json.loads((REC / "cheating_kernel.json").read_text())
    reply["content"][0]["input"]["family"] = "flash_mla"
    api = FakeAPI((200, reply))
    p = proposer(api, kinds=("kernel",), kernel_families={"rmsnorm": "forward(x, weight, eps)"})
    with pytest.raises(ProposalRejected, match="flash_mla.*not offered"):
        p.ask()
    reply["content"][0]["name"] = "run_shell"
    api = FakeAPI((200, reply))
    p = proposer(api, kinds=("kernel",), kernel_families={"rmsnorm": "forward(x, weight, eps)"})
    with pytest.raises(ProposalRejected, match="run_shell"):
        p.ask()


def test_api_errors_fail_clearly_without_the_key():
    from tuner.errors import OperationFailed

    api = FakeAPI((401, {"type": "error", "error": {"type": "authentication_error",
                                                     "message": "invalid x-api-key"}}))
    p = proposer(api)
    with pytest.raises(OperationFailed, match="HTTP 401: invalid x-api-key") as e:
        p.ask()
    assert KEY not in str(e.value)


def test_model_is_switchable_by_option_and_environment(monkeypatch):
    api = FakeAPI("good_host.json", "good_host.json")
    proposer(api, model="claude-sonnet-5-5").ask()
    monkeypatch.setenv("METALTUNE_LLM_MODEL", "claude-haiku-4-5")
    p = proposer(api)
    p.ask()
    assert [r["body"]["model"] for r in api.requests] == ["claude-sonnet-5-5", "claude-haiku-4-5"]
    assert p.last_cost["usd"] == pytest.approx((6012 * 1 + 388 * 5 + 5800 * 1.25) / 1e6)


def test_no_key_is_bad_input(monkeypatch):
    from tuner.errors import BadInput

    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    p = make("llm", space())
    with pytest.raises(BadInput, match="ANTHROPIC_API_KEY"):
        p.ask()
    with pytest.raises(BadInput, match="model context 'gpt-moe'"):
        make("llm", space(), models=("gpt-moe",))
