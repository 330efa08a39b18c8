"""What a Hugging Face transformers user gets for the same three DeepSeek-V3 layers: its
DeepseekV3ForCausalLM (5.x caches the compressed latent and decompresses K and V for every head
over the whole cache at each step), random weights, bf16, SDPA attention, one decode token per
sequence over a cache pre-filled with random latents; eager, as `generate` runs it.

  python3 benchmarks/experiments/hf_deepseek.py --contexts 4096,32768 --batch 32
  python benchmarks/experiments/hf_deepseek.py --tiny      # CPU: the script itself

Used by benchmarks/bench_mla.py --hf."""
from __future__ import annotations

import argparse
import json
import time


def config(tiny: bool):
    from transformers import DeepseekV3Config

    if tiny:
        return DeepseekV3Config(vocab_size=256, hidden_size=64, intermediate_size=128,
                                moe_intermediate_size=32, num_hidden_layers=2,
                                first_k_dense_replace=2, num_attention_heads=4,
                                num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=512,
                                qk_rope_head_dim=64, qk_nope_head_dim=16, v_head_dim=16,
                                n_routed_experts=4, num_experts_per_tok=2, n_group=1,
                                topk_group=1, max_position_embeddings=4096, rope_scaling=None)
    return DeepseekV3Config(vocab_size=129280, hidden_size=7168, intermediate_size=18432,
                            moe_intermediate_size=2048, num_hidden_layers=3,
                            first_k_dense_replace=3, num_attention_heads=128,
                            num_key_value_heads=128, q_lora_rank=1536, kv_lora_rank=512,
                            qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
                            max_position_embeddings=163840, rope_scaling=None)


def decode_tok_s(contexts, batch: int, tiny: bool = False, steps: int = 3) -> list[dict]:
    import torch
    from transformers import DeepseekV3ForCausalLM, DynamicCache

    dev = "cpu" if tiny else "cuda"
    cfg = config(tiny)
    cfg._attn_implementation = "sdpa"
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(dev):
            model = DeepseekV3ForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(torch.float32)
    out = []
    g = torch.Generator(device=dev).manual_seed(0)
    for ctx in contexts:
        row = {"batch": batch, "ctx": ctx}
        try:
            cache = DynamicCache(config=cfg)
            for i in range(cfg.num_hidden_layers):
                cache.update(torch.randn(batch, 1, ctx, cfg.kv_lora_rank, generator=g,
                                         device=dev, dtype=torch.bfloat16),
                             torch.randn(batch, 1, ctx, cfg.qk_rope_head_dim, generator=g,
                                         device=dev, dtype=torch.bfloat16), i)
            ids = torch.randint(0, cfg.vocab_size, (batch, 1), device=dev)
            pos = torch.full((batch, 1), ctx, device=dev)
            cpos = torch.tensor([ctx], device=dev)

            def step():
                r = model(input_ids=ids, past_key_values=cache, position_ids=pos,
                          cache_position=cpos, use_cache=True)
                cache.crop(-1)  # drop the token just written: every step sees ctx again
                return r.logits

            with torch.no_grad():
                step()
                if dev == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(steps):
                    step()
                if dev == "cuda":
                    torch.cuda.synchronize()
                dt = (time.perf_counter() - t0) / steps
            row.update(step_ms=dt * 1e3, tok_s=batch / dt)
        except Exception as e:  # noqa: BLE001  (an OOM at one context must not lose the others)
            row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        out.append(row)
        print("hf", json.dumps(row), flush=True)
        del cache
        if dev == "cuda":
            torch.cuda.empty_cache()
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", default="4096")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--tiny", action="store_true")
    a = ap.parse_args()
    decode_tok_s([int(x) for x in a.contexts.split(",")], a.batch, a.tiny)
