"""A workload by the name the user gives (`--workload`)."""
from __future__ import annotations

from typing import Any, Optional

from tuner.errors import BadInput


def make_workload(host: Any, workload: Optional[str], metric_regex: Optional[str],
                  timeout_s: float) -> Any:
    """`sim` (the simulated host's model), `sim-llama` (the CPU Llama scaled by the simulated
    host's model: host and kernel effects in one metric, tuner.sim.llama_host), `cmd:<command
    line>` (the user's own benchmark, with --metric-regex), `llama` (the holistic inference
    workload), `deepseek` / `deepseek-v3.2` (DeepSeek-V3's first three layers, MLA decode over
    a paged latent cache; V3.2 with the indexer and sparse attention) or `hf:<config>[:layers=N]`
    (the holistic workload on Hugging Face transformers, tuner.workloads.hf)."""
    if workload is None:
        workload = "sim" if host.backend == "sim" else "llama"
    if workload in ("sim", "sim-llama"):
        if host.backend != "sim":
            raise BadInput(f"--workload {workload} needs --backend sim (it simulates the GPU host)")
        if workload == "sim-llama":
            from tuner.sim.llama_host import SimHostLlamaWorkload

            return SimHostLlamaWorkload(host.root)
        from tuner.sim.workload import SimWorkload

        return SimWorkload(host.root)
    if workload.startswith("cmd:"):
        if not metric_regex:
            raise BadInput("--workload cmd:... needs --metric-regex")
        from tuner.workloads.command import CommandWorkload

        return CommandWorkload(workload[4:], metric_regex, timeout_s=timeout_s)
    if workload == "llama":
        from tuner.workloads.llama import LlamaWorkload

        return LlamaWorkload()
    if workload in ("deepseek", "deepseek-v3.2"):
        import torch

        from tuner.workloads.deepseek import DeepSeekConfig, DeepSeekWorkload

        # the real three layers on a GPU, the tiny preset on the CPU (interpreter kernels)
        big = torch.cuda.is_available()
        name = {("deepseek", True): "deepseek-v3-3l", ("deepseek", False): "tiny",
                ("deepseek-v3.2", True): "deepseek-v3.2-3l",
                ("deepseek-v3.2", False): "tiny-v3.2"}[(workload, big)]
        return DeepSeekWorkload(DeepSeekConfig.preset(name))
    if workload == "llama-tp" or workload.startswith("llama-tp:"):
        return tensor_parallel(workload)
    if workload.startswith("hf:"):
        from tuner.workloads.hf import HFWorkload, parse_spec

        try:
            parse_spec(workload)
            import transformers  # noqa: F401
        except ValueError as e:
            raise BadInput(str(e)) from None
        except ImportError:
            raise BadInput("--workload hf:...: needs transformers (pip install 'metaltune[hf]')") from None
        return HFWorkload(workload)
    raise BadInput(f"--workload: expected sim, sim-llama, llama, deepseek, deepseek-v3.2, "
                   f"hf:<config>, llama-tp[:...] or cmd:<command>, got {workload!r}")


def tensor_parallel(spec: str) -> Any:
    """`llama-tp[:PRESET][:tp=N][:p2p=on|off][:backend=nccl|gloo]` (defaults: tiny on CPUs and
    llama3-8b-4l on GPUs, tp 2, P2P on, NCCL when there are tp GPUs)."""
    from tuner.workloads.tensor_parallel import TensorParallelWorkload

    kw: dict[str, Any] = {}
    for part in spec.split(":")[1:]:
        key, eq, value = part.partition("=")
        if not eq:
            kw["model"] = key
        elif key == "tp" and value.isdigit():
            kw["tp"] = int(value)
        elif key == "p2p" and value in ("on", "off"):
            kw["p2p"] = value == "on"
        elif key == "backend" and value in ("nccl", "gloo"):
            kw["backend"] = value
        else:
            raise BadInput(f"--workload {spec}: expected PRESET, tp=N, p2p=on|off or "
                           f"backend=nccl|gloo, got {part!r}")
    if "model" not in kw:
        import torch

        kw["model"] = "llama3-8b-4l" if torch.cuda.device_count() >= kw.get("tp", 2) else "tiny"
    try:
        return TensorParallelWorkload(**kw)
    except ValueError as e:
        raise BadInput(f"--workload {spec}: {e}") from None
