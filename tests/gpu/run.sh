#!/usr/bin/env bash
# GPU smoke test for the WMRL trainer (one GPU, no internet, under 10 minutes).
#
# What it exercises, with a small model saved from a config (nothing is downloaded):
#   1. `vllm serve` (subprocess) with the operator's rendered world-model args: the `llm` world model;
#   2. TRL's vLLM generation (colocate mode) for the policy;
#   3. a few WMRL steps on CUDA: anchors executed by a real sandbox server process,
#      world-model grading through the vLLM server, calibration, GRPO update.
# Needs: the repo installed with the [train,gpu] extras (vllm==0.31.0) in the active Python.
# Usage: tests/gpu/run.sh [--steps N] [--keep DIR]     (results JSON: $OUT/gpu-smoke.json if $OUT is set)
# The same script on CPU, in CI: tests/vllm_cpu/test_gpu_smoke_on_cpu.py (gpu_smoke.py --device cpu).
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python}

export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH="$PWD:$PWD/trainer:$PWD/sandbox-image:$PWD/operator${PYTHONPATH:+:$PYTHONPATH}"
# TRL's colocated vLLM runs as a one-process torch.distributed group.
export RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=${MASTER_PORT:-29533}
# The policy's colocated engine (spec.policy.vllmGpuMemoryUtilization 0.2) and the world-model server share the GPU.

"$PYTHON" -c "import torch, vllm; assert torch.cuda.is_available(), 'no CUDA device'; print('torch', torch.__version__, 'vllm', vllm.__version__, torch.cuda.get_device_name(0))"
exec timeout --signal=TERM --kill-after=20 570 "$PYTHON" tests/gpu/gpu_smoke.py "$@"
