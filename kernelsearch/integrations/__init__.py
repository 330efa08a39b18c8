"""Bridges from the tuned kernels to other people's model code. Each module imports its framework
lazily, so `kernelsearch` stays importable without it (`transformers`: the `hf` extra)."""
