"""The DeepSeek workload where users run it (issue 45): the heads one GPU holds under tensor
parallelism (`heads=`), two query tokens a step (multi-token prediction, `sq=2`) and ragged
batches (`ragged=1`, a length per request). Each decode step against the model's own
non-absorbed prefill over the same tokens; the spec's bad values as one-line errors."""
import pytest
import torch

from tuner.errors import BadInput
from tuner.workloads.deepseek import DeepSeek, DeepSeekConfig, from_spec
from tuner.workloads.factory import parse as parse_spec
from tuner.workloads.llama import Ops, Runtime, rel_err

PLAIN = Ops(Runtime(use_dispatch=False))


def _model(**changes):
    from dataclasses import replace

    return DeepSeek(replace(DeepSeekConfig.preset("tiny"), **changes), "cpu", seed=0)


def _toks(n, b=2, seed=5):
    return torch.randint(0, 256, (b, n), generator=torch.Generator().manual_seed(seed))


def test_spec_sets_heads_query_tokens_and_ragged_batches():
    wl = from_spec(parse_spec("deepseek:batch=4:ctx=40:heads=16:sq=2:ragged=1"))
    c = wl.model.cfg
    assert (c.n_heads, c.s_q, c.ragged) == (16, 2, True)
    assert from_spec(parse_spec("deepseek-v3.2:heads=32")).model.cfg.n_heads == 32


@pytest.mark.parametrize("arg", ["heads=0", "heads=16,32", "sq=3", "ragged=2", "tp=8",
                                 "heads=x"])
def test_spec_rejects_bad_values_in_one_line(arg):
    with pytest.raises(BadInput) as e:
        from_spec(parse_spec(f"deepseek:{arg}"))
    msg = str(e.value)
    assert "\n" not in msg and arg.split("=")[0] in msg and "heads=N" in msg


def test_spec_refuses_multi_token_prediction_on_the_sparse_model():
    with pytest.raises(BadInput, match="sq=2.*dense"):
        from_spec(parse_spec("deepseek-v3.2:sq=2"))


def test_mtp_step_is_the_prefill_over_both_tokens():
    """s_q = 2: the step's tokens at pos - 1 and pos (the draft is the same id), causal within
    the step through the paged cache: its logits are the prefill's at pos over those tokens."""
    model = _model(n_heads=16, s_q=2)
    toks = _toks(40)
    pos = 37  # the step's two tokens straddle nothing; 36 and 37, past two 16-token pages
    cache = model.new_cache(2, pos + 1, fill="zeros")
    with torch.no_grad():
        model.prefill(PLAIN, toks[:, :pos - 1], cache)
        step = model.decode_step(PLAIN, toks[:, pos], pos, cache)
        seq = torch.cat([toks[:, :pos - 1], toks[:, pos:pos + 1], toks[:, pos:pos + 1]], dim=1)
        full = model.prefill(PLAIN, seq, None)
    assert rel_err(step, full) < 5e-3
    assert step.std() > 0.1


def test_ragged_step_attends_each_sequence_at_its_own_length():
    model = _model(ragged=True)
    B, pos = 4, 45
    toks = _toks(pos + 1, b=B, seed=7)
    cache = model.new_cache(B, pos + 1, fill="zeros", seed=3)
    last = model.step_positions(pos, B, cache)[:, -1].tolist()
    assert last[0] == pos and len(set(last)) > 1  # the longest at the context, others drawn
    with torch.no_grad():
        model.prefill(PLAIN, toks[:, :pos], cache)
        step = model.decode_step(PLAIN, toks[:, pos], pos, cache)
        for b in range(B):
            seq = torch.cat([toks[b:b + 1, :last[b]], toks[b:b + 1, pos:pos + 1]], dim=1)
            assert rel_err(step[b:b + 1], model.prefill(PLAIN, seq, None)) < 5e-3, b


def test_search_mixed_traces_the_mtp_slot_at_the_tensor_parallel_heads():
    from tuner.search.mixed.space import trace_kernel_calls
    from tuner.workloads.factory import make_workload

    wl = make_workload(type("H", (), {"backend": "local"})(), "deepseek:heads=16:sq=2:ragged=1",
                       None, 60)
    calls = trace_kernel_calls(wl)
    mtp = sorted(k[2] for k in calls if k[0] == "mla_decode_mtp")
    # (B, H, capacity, page, s_q, R) at both CPU contexts
    assert mtp == [(2, 16, 32, 16, 2, 1), (2, 16, 80, 16, 2, 1)]
    assert not [k for k in calls if k[0] == "mla_decode"]
