"""The engine's own bench client (`vllm.benchmarks.serve`) run with the engine's python in a
child (bench_driver.py: its result dict as JSON; no output is parsed), in its own process group
that dies with its parent and is killed whole at its timeout."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Sequence

from kernelsearch.harness.confine import die_with_parent
from tuner.workloads.serving.config import ServingConfig
from tuner.workloads.serving.server import TAIL, EngineFailed, engine_env

DRIVER = Path(__file__).with_name("bench_driver.py")


def bench_args(cfg: ServingConfig, url: str) -> list[str]:
    """The client's arguments but --max-concurrency (the driver adds each level's)."""
    return ["--backend", "vllm", "--base-url", url, "--model", str(cfg.model),
            "--dataset-name", "random", "--random-input-len", str(cfg.input_len),
            "--random-output-len", str(cfg.output_len), "--num-prompts", str(cfg.num_prompts),
            "--temperature", "0", "--seed", str(cfg.seed), "--ignore-eos",
            "--goodput", f"ttft:{cfg.ttft_ms:g}", f"tpot:{cfg.tpot_ms:g}",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99"]


def run(cfg: ServingConfig, url: str, ladder: Sequence[int], repeats: int,
        timeout_s: float) -> list[dict[str, Any]]:
    """One result dict per (repeat, level), in that order. EngineFailed("bench_failed") when the
    client fails or completes no request, ("bench_timeout") past `timeout_s`."""
    python = cfg.python()
    if not python:
        raise EngineFailed("bench_failed", "no engine python for the bench client (engine_python or "
                           "$METALTUNE_VLLM_PYTHON)")
    parent = os.getpid()

    def preexec() -> None:
        os.setsid()
        die_with_parent(parent)

    with tempfile.TemporaryDirectory(prefix="metaltune-bench-") as d:
        out = Path(d) / "result.json"
        argv = [python, str(DRIVER), str(out), ",".join(map(str, ladder)), str(repeats),
                *bench_args(cfg, url)]
        with open(Path(d) / "client.log", "wb+") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, cwd=d, env=engine_env({}),
                                    preexec_fn=preexec)
            try:
                rc = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
                raise EngineFailed("bench_timeout", f"bench client exceeded {timeout_s:g}s") from None
            log.seek(max(0, log.seek(0, 2) - TAIL))
            tail = log.read().decode(errors="replace")
        if rc != 0 or not out.exists():
            raise EngineFailed("bench_failed", f"bench client exited {rc}; output ends: {tail!r}")
        runs = json.loads(out.read_text())["runs"]
    for r in runs:
        if not r.get("completed"):
            raise EngineFailed("bench_failed", f"no request completed at concurrency "
                               f"{r.get('concurrency')} ({r.get('failed')} failed); client output "
                               f"ends: {tail!r}")
    return runs
