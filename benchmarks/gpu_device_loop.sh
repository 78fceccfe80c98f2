#!/usr/bin/env bash
# The device loop and the GPU's calibration on ONE GPU in one device call (<= 8 minutes):
#
#   bash benchmarks/gpu_device_loop.sh       # on the GPU machine, from the repository root
#
# 1. the device loop's GPU tests (`tests/test_device_loop_gpu.py`, `tests/test_kernels_tree_state.py`);
# 2. `bench_device_loop.py`: the 21 validation configurations, host loop against device loop,
#    paired in one process (~3 minutes);
# 3. `swiftspec profile calibrate`: the few numbers `profile derive` needs for this GPU (<= 2 minutes).
# Writes $OUT/{device_loop/{device_loop.csv, device_loop.json, device_loop_summary.csv},
# calibrate.json, device_loop.log}: 5 files.
set -uo pipefail
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/swiftspec-out}
PY=${PY:-python3}
mkdir -p "$OUT/device_loop"
t0=$(date +%s)
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv 2>/dev/null || true
  timeout 210 $PY -m pytest -q --maxfail=3 -p no:cacheprovider -m "gpu or not gpu" tests/test_device_loop_gpu.py \
      tests/test_kernels_tree_state.py 2>&1 | tail -5
  echo "tests done after $(( $(date +%s) - t0 )) s"
  timeout 270 $PY benchmarks/bench_device_loop.py --out "$OUT/device_loop" 2>&1 | tail -26
  echo "bench done after $(( $(date +%s) - t0 )) s"
  t1=$(date +%s)
  timeout 150 $PY -m swiftspec profile calibrate -o "$OUT/calibrate.json" 2>&1 | tail -6
  echo "calibrate took $(( $(date +%s) - t1 )) s"
  echo "all done after $(( $(date +%s) - t0 )) s"
} 2>&1 | tee "$OUT/device_loop.log"
