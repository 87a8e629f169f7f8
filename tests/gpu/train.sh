#!/usr/bin/env bash
# GPU check of the trainer's launch paths without vLLM: one process on CUDA with resume, two turns,
# and two launchers as two nodes sharing the GPU (DDP and FSDP over gloo). See train_check.py.
# Needs torch with CUDA, TRL and the repo's Python packages; no internet, nothing downloaded.
# Usage: tests/gpu/train.sh [train_check.py options]   (results JSON: $OUT/gpu-train.json if $OUT is set)
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD:$PWD/trainer:$PWD/sandbox-image:$PWD/operator${PYTHONPATH:+:$PYTHONPATH}"
"$PYTHON" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print('torch', torch.__version__, torch.cuda.get_device_name(0))"
exec timeout --signal=TERM --kill-after=20 560 "$PYTHON" tests/gpu/train_check.py "$@"
