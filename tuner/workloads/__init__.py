"""Workloads: things that measure. `Workload.measure(repeats) -> tuner.trial.Measurement`.

- `tuner.workloads.llama.LlamaWorkload`: the holistic inference benchmark (prefill and decode
  tokens/s per context length and batch size, decode under CUDA graphs);
- `tuner.workloads.deepseek.DeepSeekWorkload`: DeepSeek-V3's first three layers (absorbed MLA
  decode over a paged latent cache; V3.2's indexer + top-k sparse attention), the same runners;
- `tuner.workloads.hf.HFWorkload`: the holistic workload on a Hugging Face transformers model;
- `tuner.workloads.holistic`: what those three share (size grid, timing loop, cached output
  check, `measure`, and the one place a failure of the candidate's run becomes WorkloadFailed);
- `tuner.workloads.command.CommandWorkload`: the user's own benchmark command + a metric regex.

Nothing is imported here: `llama`'s model code also runs on GPU machines without pydantic
(benchmarks/bench_holistic.py), so importing the package must stay free of tuner.trial.
"""
