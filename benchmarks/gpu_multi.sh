#!/usr/bin/env bash
# Multi-GPU runs in ONE device call each: draft and target on separate GPUs over NCCL — profile,
# plan, run, compare. Keep NCCL_NVLS_ENABLE=0 etc. (set below).
#
#   GPUS=2 bash benchmarks/gpu_multi.sh     # two GPUs, ≈ 5-6 min
#   GPUS=8 bash benchmarks/gpu_multi.sh     # eight GPUs, ≈ 8-10 min; PAIRS=... to split it
#   DEVICE=cpu SMOKE=1 GPUS=2 bash benchmarks/gpu_multi.sh   # CPU smoke run: gloo ranks, tiny shapes
#   WEIGHT_FORMAT=fp8 GPUS=8 bash benchmarks/gpu_multi.sh     # the same with weight-only fp8 models
#
# 1. compute: GPUS=2 measures the pairs' models at TP 1 and 2 in the call (`profile compute`; the
#    SmolLM2 shapes are in no bundled profile); GPUS>2 copies the bundled measured H200 compute
#    (70B/72B shards take minutes to re-time; WEIGHT_FORMAT=fp8: the bundled h200-fp8 compute, which
#    has Llama-3-70B/8B/3.2-3B/3.2-1B only, so the Qwen2 pair is skipped) -> $OUT/multi/profile.
#    WEIGHT_FORMAT=fp8 measures (or copies) fp8 shards, so the plans predict fp8 models and `run`
#    runs them (it follows the plan's profile)
# 2. `profile comm --world GPUS`: NCCL send/recv and all-reduce, symmetric-memory one-shot
#    all-reduce, eager and graph-captured, every group size 2..GPUS -> $OUT/multi/profile/comm.csv
# 3. per pair (PAIRS: space-separated "target,draft,acceptance" with acceptance a bundled
#    swiftspec/data/acceptance/NAME.json, replayed as synthetic acceptance):
#    `plan --gpus GPUS --modes async` (the best async split and tree), then `run` that plan with
#    random weights: async plus the serial and autoregressive baselines over all GPUS in the same
#    launch, PROMPTS x MAX_NEW tokens, measured against predicted (re-simulated for the run).
#    Defaults: GPUS=2: (a) Llama-3-8B + Llama-3.2-1B, acceptance of the measured SmolLM2 /
#    int3 pair; (b) the offline SmolLM2 pair's shapes (benchmarks/configs: 135M target, drop-10
#    draft; the weights cannot go to the GPU machine) with that pair's measured acceptance.
#    GPUS=8: Llama-3-70B + Llama-3.2-3B and Qwen2-72B + Qwen2-1.5B, acceptance fitted to
#    the paper's Table 7 (synthetic).
#
# Writes $OUT/multi.log (everything printed) and $OUT/multi.tgz (profile/, plan_<i>.json, run_<i>/):
# one archive, because only 8 files come back from a device call.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # never NVLink multicast
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/swiftspec-out}
PY=${PY:-python3}
DEVICE=${DEVICE:-cuda}
GPUS=${GPUS:-2}
PROMPTS=${PROMPTS:-4}
MAX_NEW=${MAX_NEW:-96}
WEIGHT_FORMAT=${WEIGHT_FORMAT:-native}
W="$OUT/multi"
rm -rf "$W" && mkdir -p "$W"
exec > >(tee "$OUT/multi.log") 2>&1

if [ "$GPUS" = 2 ]; then
  PAIRS=${PAIRS:-"Llama-3-8B,Llama-3.2-1B,smollm2-135m__int3g32 benchmarks/configs/smollm2-135m,benchmarks/configs/smollm2-drop10,smollm2-135m__drop10"}
  COMPUTE=${COMPUTE:-measure}
else
  PAIRS=${PAIRS:-"Llama-3-70B,Llama-3.2-3B,qwen2-72b-table7 Qwen2-72B,Qwen2-1.5B,qwen2-72b-table7"}
  COMPUTE=${COMPUTE:-bundled}
fi
GRID=()
if [ "${SMOKE:-0}" = 1 ]; then  # tiny Llama shapes made here, small grid: checks the plumbing only
  $PY - "$W/tiny" <<'PYEOF'
import sys
from transformers import LlamaConfig
for name, layers, hidden in (("tiny-target", 4, 128), ("tiny-draft", 2, 64)):
    LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=512, max_position_embeddings=2048).save_pretrained(f"{sys.argv[1]}/{name}")
PYEOF
  T=$W/tiny/tiny-target D=$W/tiny/tiny-draft
  PAIRS="$T,$D,smollm2-135m__int3g32" COMPUTE=measure  # one pair: the loop over pairs is the same
  GRID=(--tokens 1,2,4,8,16,32 --kv 64,1024 --compact 1,2,4,8,16,32)
  PROMPTS=2 MAX_NEW=12 PLAN_PROMPT=32
fi
if ! $PY -c "import simpy" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then  # the GPU machine has no simpy
  $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
t0=$(date +%s)
stamp() { echo "== $1 after $(( $(date +%s) - t0 )) s"; }
$PY -c "import torch; print('torch', torch.__version__, 'gpus', torch.cuda.device_count())"
nvidia-smi --query-gpu=index,name,driver_version --format=csv 2>/dev/null || true

mkdir -p "$W/profile"
if [ "$COMPUTE" = measure ]; then
  models=$(for p in $PAIRS; do echo "$p" | cut -d, -f1,2; done | tr '\n' ',' | sed 's/,$//')
  tps=$(seq -s, 1 "$GPUS")
  stamp "1. profile compute: $models at TP $tps"
  $PY -m swiftspec profile compute --device "$DEVICE" --models "$models" --tp "$tps" "${GRID[@]}" \
      --weight-format "$WEIGHT_FORMAT" -o "$W/profile" --time-budget "${COMPUTE_BUDGET:-200}" || exit 2
else
  src=swiftspec/data/profiles/$([ "$WEIGHT_FORMAT" = fp8 ] && echo h200-fp8 || echo h200-measured)
  stamp "1. compute: the bundled $src"
  cp "$src/compute.csv" "$src/meta.json" "$W/profile/"
fi
stamp "2. profile comm over $GPUS"
$PY -m swiftspec profile comm --device "$DEVICE" --world "$GPUS" -o "$W/profile" --timeout "${COMM_BUDGET:-150}" || exit 2
$PY -m swiftspec profile check "$W/profile" | head -12

i=0
for p in $PAIRS; do
  i=$((i + 1))
  IFS=, read -r T D ACC <<< "$p"
  ACC=swiftspec/data/acceptance/$ACC.json
  stamp "3.$i plan --gpus $GPUS --modes async: $T + $D"
  $PY -m swiftspec plan --gpus "$GPUS" --device "$DEVICE" --target "$T" --draft "$D" --profile "$W/profile" \
      --acceptance "$ACC" --modes async --prompt-len "${PLAN_PROMPT:-256}" --max-new-tokens "$MAX_NEW" \
      -o "$W/plan_$i.json" || continue
  stamp "4.$i run: async, serial, autoregressive"
  $PY -m swiftspec run --plan "$W/plan_$i.json" --device "$DEVICE" --weights random --acceptance "$ACC" \
      --num-prompts "$PROMPTS" --max-new-tokens "$MAX_NEW" --timeout "${RUN_TIMEOUT:-300}" -o "$W/run_$i"
done
stamp "done"
tar czf "$OUT/multi.tgz" -C "$OUT" multi && rm -rf "$W"
ls -la "$OUT"
