#!/usr/bin/env bash
# Profile the bundled model shapes on one H200 in ONE device call (<= 9 minutes), for
# swiftspec/data/profiles/h200-measured/.
#
#   bash benchmarks/gpu_profile.sh            # on the GPU machine, from the repository root
#
# Writes $OUT/h200-profile/{compute.csv, comm.csv, meta.json} (+ compute.partial.csv if the time
# budget ran out: carry it back and run again with RESUME=that file), and $OUT/{compute.log, check.txt,
# summary.txt}. Copy $OUT/h200-profile to swiftspec/data/profiles/h200-measured/.
#
# Grid and budget. Every (model, TP shard, tokens, kv_len) point is one CUDA-graph capture of the
# shard's full forward (2 eager warm-ups + capture) and 3 + max(5, 60 ms / t) + 2 timed replays.
# Per point that is about 10 x t + 60 ms of host work, t = replay time; summed over the grid:
#   Llama-3-70B / Qwen2-72B  (tp 2,4,6,8; tp 1 does not fit with KV)   ~35 s each
#   R1-Distill-Qwen-32B, deepseek-coder-33b                           ~20 s each
#   Llama-3-8B                                                          ~15 s
#   3B, 1.5B, 1.3B, 1B shards (host-bound captures)                     ~15 s each
# plus ~1 s per shard of small ops (embed, LM head, tree growth, KV compaction, unrolled x16 in a
# graph), ~2 s per shard of random-weight construction, and host overhead (~20 s): ~5 minutes.
# tokens 1..256 (powers of two: the runtime's graph buckets, so every forward the runtime replays
# is a profiled shape); kv_len {512, 2048, 8192}: attention is linear in the KV length, so three
# points interpolate it (the latency model clamps below 512, where attention is a few % of a
# step, and refuses above 8192). Shapes shared by several bundled models are timed once and
# copied (meta.json `aliases`). --time-budget stops new points at 420 s so the call always returns
# what it measured; models are ordered by importance.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # never NVLink multicast
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/swiftspec-out}
DEVICE=${DEVICE:-cuda}
BUDGET=${BUDGET:-420}
P="$OUT/h200-profile"
mkdir -p "$P"
# resume: RESUME=path/to/compute.partial.csv of an earlier, budget-cut run (it skips those keys and
# measures the rest). Only with the same kernels: rows timed with other defaults must not be mixed in.
RESUME=${RESUME:-}
if [ -f "$RESUME" ] && [ ! -f "$P/compute.partial.csv" ]; then
  cp "$RESUME" "$P/compute.partial.csv" && echo "resuming from $RESUME ($(($(wc -l < "$RESUME") - 1)) rows)"
  # its meta.json says which weight format the rows have (an fp8 folder refuses native rows)
  if [ -f "$(dirname "$RESUME")/meta.json" ]; then cp "$(dirname "$RESUME")/meta.json" "$P/meta.json"; fi
fi
PY=${PY:-python3}

# required shapes first, then models that share their shapes (copied), then the other bundled shapes
MODELS=${MODELS:-Llama-3-70B,Llama-3-8B,Llama-3.2-3B,Llama-3.2-1B,Qwen2-72B,Qwen2-1.5B,Llama-3.3-70B,R1-Distill-Llama-70B,R1-Distill-Llama-8B,R1-Distill-Qwen-1.5B,R1-Distill-Qwen-32B,deepseek-coder-33b,deepseek-coder-1.3b}
EXTRA=${EXTRA:-}  # e.g. EXTRA="--quick" for a smoke test
ATTENTION=${ATTENTION:-auto}  # the runtime's default (Triton kernels on CUDA); ATTENTION=torch profiles SDPA
ATTENTION_WS=${ATTENTION_WS:-auto}  # on: the Gluon tree attention from 128 rows per KV head (sm_90)
WEIGHT_FORMAT=${WEIGHT_FORMAT:-native}  # fp8: weight-only fp8 shards (give another OUT: a folder keeps one format)

t0=$(date +%s)
$PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu')"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>/dev/null || true

$PY -m swiftspec profile compute --device "$DEVICE" --models "$MODELS" -o "$P" --time-budget "$BUDGET" \
    --attention "$ATTENTION" --attention-ws "$ATTENTION_WS" --weight-format "$WEIGHT_FORMAT" $EXTRA \
    2>&1 | tee "$OUT/compute.log"
echo "compute done after $(( $(date +%s) - t0 )) s"

# one GPU: prints that communication needs >= 2 GPUs and writes the published defaults, labelled
$PY -m swiftspec profile comm --device "$DEVICE" -o "$P" --timeout 60 2>&1 | tee -a "$OUT/compute.log"

$PY -m swiftspec profile check "$P" > "$OUT/check.txt" 2>&1
head -12 "$OUT/check.txt"

$PY - "$P" > "$OUT/summary.txt" <<'PYEOF'
import sys
import pandas as pd
c = pd.read_csv(f"{sys.argv[1]}/compute.csv")
f = c[(c.op == "forward") & (c.kv_len == 2048) & c.tokens.isin([1, 8, 64, 256])]
t = f.pivot_table(index=["model", "tp"], columns="tokens", values="ms").round(3)
print("forward ms of one TP shard (no communication), kv_len 2048, by tokens:")
print(t.to_string())
h = c[c.op == "host"]
print("\nhost ms per iteration:", dict(zip(h.model, h.ms.round(3))))
PYEOF
cat "$OUT/summary.txt"
echo "total $(( $(date +%s) - t0 )) s; files in $P:"; ls -la "$P"
