"""A plain user script: a transformers model, the tuned table applied with one `patch` call, and
greedy decode through transformers' documented fast path (StaticCache + torch.compile
"reduce-overhead", fullgraph): decode tokens/s per context. Only a config dict comes from the
tuner package (no workload, runner or timer of its own), so what it prints is what a user of the
kept table gets.

    python3 examples/hf_user_decode.py --table STATE_DIR/kernels/mixed-<run>.json \
        [--config llama3-8b] [--layers 4] [--batch 8] [--ctx 4096,32768] [--steps 32]
    python3 examples/hf_user_decode.py --table none ...      # the same without the patch

--config names one of the small config dicts shipped in tuner/workloads/hf.py (random weights,
no hub download); with your own model use AutoModelForCausalLM.from_pretrained instead."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", required=True, help="a dispatch table (JSON), or none")
    ap.add_argument("--config", default="llama3-8b")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--ctx", default="4096,32768", help="prompt lengths, comma-separated")
    ap.add_argument("--steps", type=int, default=32, help="timed decode steps per context")
    ap.add_argument("--chunk", type=int, default=4096, help="prefill chunk (bounds the mask)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--no-compile", action="store_true",
                    help="eager decode (a CPU smoke run: inductor's CPU compile takes minutes)")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, StaticCache

    from kernelsearch.integrations.transformers import patch, patched
    from tuner.workloads.hf import PRESETS  # a config dict, as a config.json holds it

    geometry = {**PRESETS[a.config], "num_hidden_layers": a.layers}
    dtype = getattr(torch, geometry.pop("dtype"))
    cfg = AutoConfig.for_model(**geometry)
    torch.manual_seed(0)
    with torch.device(a.device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
    if a.table != "none":
        model = patch(model, table=a.table)  # <- the one line a user adds
    print("patched:", json.dumps(patched(model)), flush=True)

    def forward(tok, cache):
        return model(input_ids=tok, past_key_values=cache, use_cache=True, logits_to_keep=1).logits

    step = forward if a.no_compile else torch.compile(forward, mode="reduce-overhead",
                                                      fullgraph=True)
    sync = torch.cuda.synchronize if a.device.startswith("cuda") else (lambda: None)
    out = {"table": a.table, "config": a.config, "layers": a.layers, "batch": a.batch,
           "patched": patched(model), "decode_tokens_per_s": {}}
    for ctx in (int(c) for c in a.ctx.split(",")):
        cache = StaticCache(config=cfg, max_cache_len=ctx + a.steps + 16)
        ids = torch.randint(0, cfg.vocab_size, (a.batch, ctx), device=a.device)
        with torch.no_grad():
            for s in range(0, ctx, a.chunk):  # prefill, eager (SDPA), chunk by chunk
                logits = forward(ids[:, s:s + a.chunk], cache)
            tok = logits[:, -1:].argmax(-1)
            for _ in range(3):  # compile, cudagraph warm-up and recording
                tok = step(tok, cache)[:, -1:].argmax(-1)
            sync()
            t0 = time.perf_counter()
            for _ in range(a.steps):
                tok = step(tok, cache)[:, -1:].argmax(-1)
            sync()
            dt = time.perf_counter() - t0
        tps = a.batch * a.steps / dt
        out["decode_tokens_per_s"][f"decode@ctx{ctx},b{a.batch}"] = tps
        print(f"ctx {ctx:>6} batch {a.batch}: {tps:8.0f} decode tokens/s "
              f"({dt / a.steps * 1e3:.2f} ms a step)", flush=True)
        del cache, ids
        if a.device.startswith("cuda"):
            torch.cuda.empty_cache()
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
