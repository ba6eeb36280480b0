#!/usr/bin/env bash
# The device checks in one run, each step under its own time limit so one hang cannot eat the rest:
#   1. the machine and the torch it has;
#   2. every CUDA test (pytest -m gpu);
#   3. compare.py on the paper's base model at its default 8 x 128, float32 and bfloat16, every
#      decode column (--wide), written as json (on an H200 this takes about 150 s; asking for
#      2 x 512 as well ran past 250 s).
# Results go under $OUT (default ./gpu-out); render a json with benchmarks.render.render.
# Usage: bash scripts/gpu_check.sh [pytest seconds] [compare seconds]
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
PYTHON=${PYTHON:-python3}

{ nvidia-smi; "$PYTHON" -c "import sys, torch; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"; } \
    >"$OUT/machine.txt" 2>&1

timeout "${1:-120}" "$PYTHON" -m pytest -m gpu -q -p no:cacheprovider -rfEs >"$OUT/pytest_gpu.txt" 2>&1
echo "pytest -m gpu: exit $?" | tee -a "$OUT/pytest_gpu.txt"

timeout "${2:-240}" "$PYTHON" compare.py --device cuda --preset base --dtype float32 bfloat16 --wide \
    --decode-len 64 --rounds 2 --min-run-time 0.2 --quiet \
    --format json --output "$OUT/compare_base.json" >"$OUT/compare_base.log" 2>&1
echo "compare.py base: exit $?" | tee -a "$OUT/compare_base.log"
tail -n 5 "$OUT/pytest_gpu.txt" "$OUT/compare_base.log"
