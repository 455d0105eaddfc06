#!/usr/bin/env bash
# GPU readiness of minilm, in under 10 minutes on one GPU: the device tests (forward passes of every
# scheme with the model on another device than the CPU's tensors would be), then bench/gpu_check.py on
# cuda (cached == uncached per scheme, the main job's speed, decode speed, a LoRA step of a
# Llama-3.2-1B shape at 8k tokens against minilm memory's prediction). Run from a clone with the
# test extra installed:  bash bench/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pytest -q -x tests/test_devices.py tests/test_lora.py tests/test_generation.py
python bench/gpu_check.py "$@"
