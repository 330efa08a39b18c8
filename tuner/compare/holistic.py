"""Adapter from the compare suite to the project's holistic workload (tuner.workloads.llama,
issue 6): decode tokens/s of the Llama-style decoder, as served (CUDA graph replay) and eager.

On a GPU: the 4-layer Llama-3-8B-shaped decoder (`llama3-8b-4l`), batch 8, 4k context (the shared
facts' shape). Without a GPU only `--quick` runs it, on the `tiny` preset (a smoke check of the
path, not a number to compare)."""
from __future__ import annotations

from typing import Any


def measure(m: Any, cfg: Any, cuda: bool, graphs: bool = True) -> Any:
    try:
        from tuner.workloads import llama
    except ImportError as e:
        m.skipped = f"holistic workload not available ({e})"
        return m
    if not cuda and not cfg.quick:
        m.skipped = "no CUDA device (the holistic decode runs on CPU only with --quick)"
        return m
    import torch

    preset, batch, ctx, steps = ("llama3-8b-4l", 8, 4096, 20) if cuda else ("tiny", 2, 64, 3)
    if cuda and cfg.quick:
        ctx, steps = 1024, 10
    model = llama.Llama(llama.LlamaConfig.preset(preset), device="cuda" if cuda else "cpu")
    rt = llama.Runtime(cuda_graphs=graphs, use_dispatch=False)
    m.params.update(model=preset, batch=batch, ctx=ctx, steps_per_sample=steps, cuda_graphs=graphs)
    with torch.no_grad():
        r = llama.DecodeRunner(model, rt, batch, ctx).prepare()
        m.samples = [r.tokens_per_s(steps) for _ in range(cfg.repeats)]
    del r, model
    if cuda:
        torch.cuda.empty_cache()
    return m


def measure_energy(m: Any, cfg: Any, cuda: bool) -> Any:
    """Decode tokens per joule: the same graph decode as `measure`, each sample's tokens over the
    joules NVML's total-energy counter (read only) advanced while it ran. Skipped without a CUDA
    device, NVML or the counter (a GPU before Volta, some vGPU profiles)."""
    if not cuda:
        m.skipped = "no CUDA device (board energy needs the GPU's own counter)"
        return m
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)  # what torch's cuda:0 is unless remapped
        pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
    except Exception as e:  # no library, no driver, NotSupported: say which
        m.skipped = f"no NVML energy counter ({type(e).__name__})"
        return m
    try:
        from tuner.workloads import llama
        import torch

        preset, batch, ctx, steps = "llama3-8b-4l", 8, 4096, 200
        if cfg.quick:
            ctx, steps = 1024, 100
        model = llama.Llama(llama.LlamaConfig.preset(preset), device="cuda")
        rt = llama.Runtime(cuda_graphs=True, use_dispatch=False)
        m.params.update(model=preset, batch=batch, ctx=ctx, steps_per_sample=steps,
                        cuda_graphs=True, source="nvml_energy_counter")
        with torch.no_grad():
            r = llama.DecodeRunner(model, rt, batch, ctx).prepare()
            for _ in range(cfg.repeats):
                torch.cuda.synchronize()
                e0 = pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
                tok_s = r.tokens_per_s(steps)
                torch.cuda.synchronize()
                mj = (pynvml.nvmlDeviceGetTotalEnergyConsumption(h) - e0) % (1 << 64)
                if mj > 0:  # the counter ticks coarsely: a sample too short reads 0
                    # tokens the timed steps made over the window's joules (any warm-up step the
                    # timer runs is in the window too: a slight underestimate, never flattery)
                    m.samples.append(batch * steps / (mj / 1000.0) if tok_s else 0.0)
        del r, model
        torch.cuda.empty_cache()
    finally:
        pynvml.nvmlShutdown()
    return m
