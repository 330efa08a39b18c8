"""What the tests that start a real vLLM server share: where the engine's own environment is, and
a small random-weight Llama with a tokenizer trained in-process (no download).

The engine runs from its own environment (`bash scripts/engine_env.sh` builds `.venv-vllm`; the
test command `bash scripts/bootstrap.sh --engines` does it for CI). Outside CI a missing engine
skips with the command to run; under CI (env CI=true) it fails, so a green CI always means the
engine was really started."""
from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SENTENCES = [
    "the quick brown fox jumps over the lazy dog",
    "metaltune measures what users serve with the engine's own client",
    "a change is kept only when goodput improves beyond the noise",
    "tokens per joule weigh speed against energy on every board",
] * 8


def engine_python() -> Path:
    """The engine environment's interpreter: $METALTUNE_VLLM_PYTHON, else .venv-vllm/bin/python."""
    p = Path(os.environ.get("METALTUNE_VLLM_PYTHON") or ROOT / ".venv-vllm" / "bin" / "python")
    if not p.exists():
        msg = f"no vLLM engine environment at {p}: run `bash scripts/engine_env.sh`"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return p


def tiny_llama(out: Path, layers: int = 2) -> Path:
    """A config-built Llama (hidden 128, 2 layers, 4 heads, 2 KV heads, bf16 random weights) and a
    byte-level BPE tokenizer (vocab 300) trained on a few sentences, saved to `out`."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(SENTENCES, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(out)
    cfg = LlamaConfig(vocab_size=fast.vocab_size, hidden_size=128, intermediate_size=256,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=2048, bos_token_id=0, eos_token_id=1,
                      torch_dtype="bfloat16")
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
