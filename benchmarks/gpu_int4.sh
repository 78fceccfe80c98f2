#!/usr/bin/env bash
# The int4 (W4A16) measurements on ONE GPU in one device call (<= 9.5 minutes), in order of need:
#
#   bash benchmarks/gpu_int4.sh                  # the int4 profile of the models at TP 1-8
#   VALIDATE=1 bash benchmarks/gpu_int4.sh       # the validation models at TP 1, then `validate`
#
# 1. the GPU tests of the int4 kernel and model (`pytest -m gpu tests/test_int4.py`, ~40 s);
# 2. `bench_w4a16.py`: Llama-3-8B's four linears at 1-256 rows, int4 against its bytes floor and
#    against bf16 and fp8 in the same run (~90 s; QUICK=1: the defaults only, ~20 s);
# 3. `bench_step_kernels.py --paired`: the Llama-3-8B step, bf16 / fp8 / int4 alternated (~40 s);
# 4. an int4 profile (`gpu_profile.sh` with WEIGHT_FORMAT=int4) of MODELS for what BUDGET leaves
#    (resumable: RESUME=its compute.partial.csv in a later call); VALIDATE=1 profiles the three
#    validation models at TP 1 only;
# 5. VALIDATE=1: `swiftspec validate` (`gpu_validate.sh`) predicted from that profile before the run,
#    for VBUDGET seconds.
# BENCH=0 skips 1-3; LOOP (device) is the loop whose host work the profile measures (`profile compute
# --loop`), and `validate` then runs that loop.
# Writes $OUT/{w4a16.json, step.json (with the machine's metadata), int4-profile.tgz (the profile
# folder: compute.csv and/or compute.partial.csv, comm.csv, meta.json), int4.log} and with VALIDATE=1
# $OUT/validation/{report.csv, report.json, host.csv}: at most 7 files (the device tool brings back 8).
set -uo pipefail
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/swiftspec-out}
PY=${PY:-python3}
BUDGET=${BUDGET:-200}
VALIDATE=${VALIDATE:-0}
VBUDGET=${VBUDGET:-300}
BENCH=${BENCH:-1}
LOOP=${LOOP:-device}
if [ "$VALIDATE" = 1 ]; then
  MODELS=${MODELS:-Llama-3-8B,Llama-3.2-3B,Llama-3.2-1B}
  TPS="--tp 1"
else
  MODELS=${MODELS:-Llama-3-70B,Llama-3.2-3B,Llama-3-8B,Llama-3.2-1B,Qwen2-72B,Qwen2-1.5B}
  TPS=""
fi
FUSED=triton+gemv+swiglu+rope+pdllate  # the runtime's CUDA defaults but the folded norm (native only)
mkdir -p "$OUT"
t0=$(date +%s)
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv 2>/dev/null || true
  if [ "$BENCH" = 1 ]; then
    timeout 90 $PY -m pytest -q -x -p no:cacheprovider -m gpu tests/test_int4.py 2>&1 | tail -5
    echo "tests done after $(( $(date +%s) - t0 )) s"
    timeout 120 $PY benchmarks/bench_w4a16.py --rows 1,2,4,8,16,32,64,128,256 ${QUICK:+--quick} --out /tmp/w4a16 \
        2>&1 | tail -24
    cp /tmp/w4a16/bench_w4a16.json "$OUT/w4a16.json"
    echo "bench_w4a16 done after $(( $(date +%s) - t0 )) s"
    timeout 150 $PY benchmarks/bench_step_kernels.py --models Llama-3-8B --tokens 1,4,16,64 --kv 1024 --paired --reps 20 \
        --no-kernels --fusions "$FUSED,$FUSED+fp8,$FUSED+int4" --out /tmp/step 2>&1 | grep -v "^ " | tail -12
    cp /tmp/step/bench_step_kernels-*.json "$OUT/step.json"
    echo "step done after $(( $(date +%s) - t0 )) s"
  fi
  OUT=/tmp/int4-out WEIGHT_FORMAT=int4 BUDGET="$BUDGET" MODELS="$MODELS" EXTRA="$TPS --loop $LOOP" timeout $((BUDGET + 60)) \
      bash benchmarks/gpu_profile.sh 2>&1 | tail -8
  # one archive: the device tool brings back at most 8 files
  tar -czf "$OUT/int4-profile.tgz" -C /tmp/int4-out h200-profile
  echo "profile done after $(( $(date +%s) - t0 )) s"
  if [ "$VALIDATE" = 1 ]; then
    PROFILE=/tmp/int4-out/h200-profile BUDGET="$VBUDGET" OUT="$OUT" bash benchmarks/gpu_validate.sh 2>&1 | tail -40
    rm -f "$OUT/validation.log"  # its lines are in int4.log
  fi
  echo "all done after $(( $(date +%s) - t0 )) s"
} 2>&1 | tee "$OUT/int4.log"
