#!/usr/bin/env bash
# The device checks in one run, each step under its own time limit so one hang cannot eat the rest:
#   1. the machine and the torch it has;
#   2. every CUDA test (pytest -m gpu);
#   3. compare.py on the paper's base model at its default 8 x 128, float32 and bfloat16, every
#      decoder (--all-decoders) and every column (--wide), written as json (on an H200 this takes
#      about 150 s; asking for 2 x 512 as well ran past 250 s), then drawn as a PNG where
#      matplotlib is installed;
#   4. long sequences on the GPU: bfloat16 forward, train step and peak memory of every row at
#      8 x 512 and 2 x 2048 (the same tokens per batch), with the SDPA kernel each row ran
#      (--max-seq-len 2048: the sinusoid table has no weights, so the model is the same);
#   5. where the base train step's GPU time goes, eager, float32 and bfloat16: a table and a PNG;
#   6. what the id-range check's host sync costs a small CUDA forward (pytest-benchmark);
#   7. greedy decoding and beam search (beam 4) of the base model (8 x 64, 64 generated ids) on
#      fused's static-shape step, eager and as a CUDA graph (torch.compile mode reduce-overhead),
#      frozen too, beside the growing cache's: the fast decoding path on a GPU.
# Results go under $OUT (default ./gpu-out); render a json with benchmarks.compare.render.render.
# Usage: bash scripts/gpu_check.sh [pytest s] [compare s] [long-sequence s] [breakdown s] [sync s]
#        [static decode s]
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
PYTHON=${PYTHON:-python3}

{ nvidia-smi; "$PYTHON" -c "import sys, torch; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"; } \
    >"$OUT/machine.txt" 2>&1

timeout "${1:-120}" "$PYTHON" -m pytest -m gpu -q -p no:cacheprovider -rfEs >"$OUT/pytest_gpu.txt" 2>&1
echo "pytest -m gpu: exit $?" | tee -a "$OUT/pytest_gpu.txt"

timeout "${2:-240}" "$PYTHON" compare.py --device cuda --preset base --dtype float32 bfloat16 --all-decoders --wide \
    --decode-len 64 --rounds 2 --min-run-time 0.2 --quiet \
    --format json --output "$OUT/compare_base.json" >"$OUT/compare_base.log" 2>&1
echo "compare.py base: exit $?" | tee -a "$OUT/compare_base.log"
"$PYTHON" -c "import json, sys; from benchmarks.compare.plot import plot; plot(json.load(open(sys.argv[1])), sys.argv[2])" \
    "$OUT/compare_base.json" "$OUT/compare_base.png" >>"$OUT/compare_base.log" 2>&1

timeout "${3:-240}" "$PYTHON" compare.py --device cuda --preset base --dtype bfloat16 \
    --batch 8 2 --src-len 512 2048 --max-seq-len 2048 --decode-len 1 --rounds 2 --min-run-time 0.2 \
    --quiet --format json --output "$OUT/compare_long.json" >"$OUT/compare_long.log" 2>&1
echo "compare.py long sequences: exit $?" | tee -a "$OUT/compare_long.log"
PICTURE=()  # the PNG only where matplotlib is installed: without it the command would refuse to start
"$PYTHON" -c "import matplotlib" 2>/dev/null && PICTURE=(--out "$OUT/breakdown-h200.png")
timeout "${4:-120}" "$PYTHON" -m benchmarks.studies.time_breakdown --device cuda --preset base \
    --dtypes float32 bfloat16 --repeats 2 --ms "${PICTURE[@]}" >"$OUT/breakdown.txt" 2>&1
echo "time_breakdown: exit $?" | tee -a "$OUT/breakdown.txt"
timeout "${5:-90}" "$PYTHON" -m pytest benchmarks/timings/bench_range_check.py -p no:cacheprovider \
    --benchmark-columns=median,iqr >"$OUT/range_check.txt" 2>&1
echo "range check: exit $?" | tee -a "$OUT/range_check.txt"
timeout "${6:-300}" "$PYTHON" -m benchmarks.studies.static_decode --device cuda --preset base --batch 8 --src-len 64 \
    --max-len 65 --modes eager reduce-overhead --freezing --search greedy beam --min-run-time 1 \
    >"$OUT/static_decode.txt" 2>&1
echo "static decoding: exit $?" | tee -a "$OUT/static_decode.txt"
tail -n 5 "$OUT/pytest_gpu.txt" "$OUT/compare_base.log" "$OUT/compare_long.log" "$OUT/breakdown.txt" \
    "$OUT/range_check.txt" "$OUT/static_decode.txt"
