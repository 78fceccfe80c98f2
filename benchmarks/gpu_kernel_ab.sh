#!/usr/bin/env bash
# Kernel A/B runs on ONE GPU in one device call (<= 9 minutes): a kernel choice that is not yet a
# default is measured against the default in the same process, paired where the effect is small.
#
#   bash benchmarks/gpu_kernel_ab.sh
#   REF=_ref bash benchmarks/gpu_kernel_ab.sh    # also another tree's bench_w4a16 (e.g. a branch:
#                                                 # git archive BRANCH | tar -x -C _ref), same machine
#
# 1. the GPU tests of the in-launch split-K sum and the shared counters (`-k combined`, the tree
#    attention's combine stress and graph replay; ~60 s);
# 2. `bench_w4a16.py --quick` (Llama-3-8B's four linears at ROWS): every format's default against
#    its variants, and with REF the same from that tree (~40 s each);
# 3. `bench_w4a16.py` with every variant (K split 1-16 ways, 64 or 128 rows a program, ...) on the
#    linears of one rank of each SHARDS model:tp pair at 1 and 16 rows (~40 s each), for the split-K
#    rule of TP shards (`gemv.dot_config`);
# 4. `bench_step_kernels.py --paired` over STEPS (model:tp pairs, one TP shard each, communication
#    skipped): FUSIONS, int4 weights (+int4) when INT4=1 (default) else native, at 1 and 16 tokens
#    (~60 s a shard). Default: PDL "late" against "prefetch" (the first weight lines asked of the L2
#    before the wait), which matters where a linear's fixed start-up is a large part of its time,
#    and int4 K split up to 24576 output rows instead of 8192 (`KernelConfig.linear_split_max_n`:
#    the 70B's TP 4-6 gate/up and TP 1 qkv then split too, 150-224 programs of 64 tiles today).
#    The linear_combine A/B of `results/kernel_ab_h100`: SHARDS= STEPS=Llama-3-8B:1,Llama-3.2-3B:2,
#    Llama-3-70B:8 FUSIONS=$F,$F+linearcombine,$F+int4,$F+int4+linearcombine, F=$FUSED+pdllate.
# Writes $OUT/{ab.log, w4a16.json, w4a16_ref.json (with REF), w4a16_<model>_tp<tp>.json,
# step_<model>_tp<tp>.json}: at most 8 (the device tool's limit).
set -uo pipefail
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/swiftspec-out}
PY=${PY:-python3}
ROWS=${ROWS:-1,16,32,64,128}
SHARDS=${SHARDS:-Llama-3-70B:6,Llama-3.2-3B:2,Llama-3-70B:8}  # the int4 plan's target and draft
STEPS=${STEPS:-Llama-3-70B:6,Llama-3.2-3B:2}
REF=${REF:-}
FUSED=triton+gemv+swiglu+rope  # the runtime's CUDA defaults but the folded norm (native only) and PDL
W=$([ "${INT4:-1}" = 1 ] && echo +int4 || true)
FUSIONS=${FUSIONS:-$FUSED+pdllate$W+linearcombine,$FUSED+pdlpf$W+linearcombine,$FUSED+pdllate$W+linearcombine+splitn24576}
mkdir -p "$OUT"
rm -rf /tmp/w4a16 /tmp/w4a16_* /tmp/step_*  # this script's scratch folders: one run's files each
t0=$(date +%s)
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv 2>/dev/null || true
  timeout 150 $PY -m pytest -q -x -p no:cacheprovider -m gpu tests/test_kernels_gemv.py \
      tests/test_kernels_tree_attention.py -k "combined or combine_stress or graph_replay" 2>&1 | tail -5
  echo "tests done after $(( $(date +%s) - t0 )) s"
  timeout 120 $PY benchmarks/bench_w4a16.py --rows "$ROWS" --quick --out /tmp/w4a16 2>&1 | tail -16
  cp /tmp/w4a16/bench_w4a16.json "$OUT/w4a16.json"
  if [ -n "$REF" ]; then
    (cd "$REF" && PYTHONPATH="$PWD:$PYTHONPATH" timeout 120 $PY benchmarks/bench_w4a16.py --rows "$ROWS" --quick \
        --out /tmp/w4a16_ref 2>&1 | tail -16)
    cp /tmp/w4a16_ref/bench_w4a16.json "$OUT/w4a16_ref.json"
  fi
  echo "bench_w4a16 done after $(( $(date +%s) - t0 )) s"
  for pair in ${SHARDS//,/ }; do
    model=${pair%%:*} tp=${pair##*:}
    timeout 120 $PY benchmarks/bench_w4a16.py --model "$model" --tp "$tp" --rows 1,16 \
        --out "/tmp/w4a16_$model$tp" 2>&1 | tail -8
    cp "/tmp/w4a16_$model$tp/bench_w4a16.json" "$OUT/w4a16_${model}_tp${tp}.json"
    echo "w4a16 $model TP $tp done after $(( $(date +%s) - t0 )) s"
  done
  for pair in ${STEPS//,/ }; do
    model=${pair%%:*} tp=${pair##*:}
    timeout 150 $PY benchmarks/bench_step_kernels.py --models "$model" --tp "$tp" --tokens 1,16 --kv 1024 --paired \
        --reps 20 --no-kernels --fusions "$FUSIONS" --out "/tmp/step_$model$tp" 2>&1 | grep -v "^ " | tail -10
    cp /tmp/step_"$model$tp"/bench_step_kernels-*.json "$OUT/step_${model}_tp${tp}.json"
    echo "step $model TP $tp done after $(( $(date +%s) - t0 )) s"
  done
  echo "all done after $(( $(date +%s) - t0 )) s"
} 2>&1 | tee "$OUT/ab.log"
