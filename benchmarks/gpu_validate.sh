#!/usr/bin/env bash
# Predicted vs measured on ONE H200 in one device call (<= 7 minutes): `swiftspec validate`.
#
#   bash benchmarks/gpu_validate.sh          # on the GPU machine, from the repository root
#
# 21 configurations: 3 pairs (Llama-3-8B + Llama-3.2-1B, Llama-3.2-3B + Llama-3.2-1B, Llama-3.2-1B
# self-draft; random bf16 weights at real shapes) x {autoregressive, chain k=2/4, serial bs4-w2-d2,
# bs8-w8-d3, bs16-w4-d4, Sequoia static bs8}, acceptance replayed from the measured SmolLM2 pair
# profile (swiftspec/data/acceptance/smollm2-135m__int3g32.json). Each is predicted from the measured
# H200 profile (swiftspec/data/profiles/h200-measured) BEFORE anything runs, for the exact workload
# (4 builtin prompts, 96 new tokens, the same rank paths); then all run in one process, models loaded
# once, CUDA graphs captured once per model. Host work per forward/token is calibrated first, per
# pair, on narrow stand-ins with the pair's vocabulary (128,256) and layer counts, minus the
# stand-ins' replay time as the profile times it and the profile's tree_growth (~6 s a pair, 3 prompts), plus
# a reference fit on the old tiny model (2 layers, vocab 256; logged only, ~3 s). Budget: ~30 s
# start-up + ~20 s calibration + ~20 s loading/graphs + PASSES (3) x 21 x ~2.5 s decoding (4 x 96
# tokens at 100-400 tok/s; a 16-token warm-up in the first pass) ~ 4 minutes; BUDGET (420 s) cuts it
# short. Each configuration's measured numbers are the medians over the passes (`--passes`).
#
# CALIBRATE=0: no per-pair host calibration; the predictions take the profile's own host rows
# (`validate --no-calibrate-host`), which is what a plan made from that profile uses.
#
# LOOP=device: first profile the three validation models at TP 1 with the device loop
# (`gpu_profile.sh` with EXTRA="--tp 1 --loop device", PBUDGET s, ~2 minutes; WEIGHT_FORMAT passes
# through), then validate from that profile, which runs that loop; PROFILE is then not read.
#
# Writes $OUT/validation/{report.csv, report.json, host.csv} and $OUT/validation.log (per-config
# predictions and measurements as they happen, so a cut-short run still tells what it saw); with
# LOOP, also $OUT/profile.tgz (the profile folder) and $OUT/profile.log.
set -uo pipefail
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/swiftspec-out}
PY=${PY:-python3}
PROFILE=${PROFILE:-swiftspec/data/profiles/h200-measured}
BUDGET=${BUDGET:-420}
PASSES=${PASSES:-3}
mkdir -p "$OUT/validation"
LOOP=${LOOP:-}
if [ -n "$LOOP" ]; then
  rm -rf /tmp/loop-profile  # this script's scratch folder: a fresh profile, not a resumed one
  OUT=/tmp/loop-profile BUDGET="${PBUDGET:-130}" MODELS=Llama-3-8B,Llama-3.2-3B,Llama-3.2-1B \
      EXTRA="--tp 1 --loop $LOOP" bash benchmarks/gpu_profile.sh > "$OUT/profile.log" 2>&1
  tail -12 "$OUT/profile.log"
  PROFILE=/tmp/loop-profile/h200-profile
  tar -czf "$OUT/profile.tgz" -C /tmp/loop-profile h200-profile
fi
if [ ! -f "$PROFILE/compute.csv" ]; then
  echo "error: $PROFILE/compute.csv not found: install the measured H200 profile first" | tee "$OUT/validation.log"
  exit 2
fi
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv 2>/dev/null || true
timeout "$BUDGET" $PY -m swiftspec validate --gpus 1 --device cuda --profile "$PROFILE" \
    --prompts "${PROMPTS:-4}" --max-new-tokens "${MAX_NEW:-96}" --passes "$PASSES" ${CONFIGS:+--configs "$CONFIGS"} \
    $([ "${CALIBRATE:-1}" = 0 ] && echo --no-calibrate-host) \
    -o "$OUT/validation" 2>&1 | tee "$OUT/validation.log"
echo "validate exit ${PIPESTATUS[0]} after $(( $(date +%s) - t0 )) s"
ls -la "$OUT/validation"
