#!/usr/bin/env bash
# Issue 11's checks for one short session on a machine with one GPU, in the order they matter:
#   1. the CUDA-only test (counter-based dropout masks: CUDA draws the CPU's bits);
#   2. a bf16 plan of a Hugging Face GPT-2 (dropout and attention dropout on) verified on one GPU;
#   3. `python -m bench.gpu` (the GPU benchmark; fills BENCHMARKS.md's GPU section).
# Usage: scripts/gpu_check.sh [BENCH_TIMEOUT_S]   (PY=python by default; run from the repo root)
set -u
PY=${PY:-python}
export PYTHONPATH=$PWD
OUT=$(mktemp -d)
"$PY" -m pytest -q -p no:cacheprovider tests/runtime/test_device_random.py -k cuda
printf 'name: one-gpu\nnodes:\n  - devices: [{type: H100, count: 1}]\n' > "$OUT/one-gpu.yaml"
"$PY" -m hapc.cli compile configs/models/hf_gpt2.py --cluster "$OUT/one-gpu.yaml" --precision bf16 \
    --set layers=2 --set seq=256 --set batch=4 --set dropout=0.1 --set attn_dropout=0.1 -o "$OUT/hf" --quiet
"$PY" "$OUT/hf/program.py" --device cuda --verify --steps 3
timeout "${1:-420}" "$PY" -m bench.gpu -o "$OUT/bench"
echo "work folder: $OUT"
