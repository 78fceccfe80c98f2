"""Skinny linear (M = 1..16 token rows) on Llama-3-8B shapes: Triton `gemv` vs cuBLAS `F.linear`
vs the weight-bytes floor (issues 3 and 4: the GEMMs alone are 1.16x the floor at 1 token).

    python benchmarks/bench_gemv.py                                   # on the H200: < 1 minute
    TRITON_INTERPRET=1 python benchmarks/bench_gemv.py --quick --device cpu --out /tmp/bg   # smoke

Each call is captured in a CUDA graph that rotates over enough weight copies to touch > 2x the
60 MB L2 per replay (each call streams cold weights, as in the step); µs per call = median replay
time / calls. Floor = weight bytes / device-to-device copy bandwidth measured in the same run.
Variants: cuBLAS (`F.linear`) and `gemv` at BLOCK_N 8/16/32 (BLOCK_K by the 8192-products rule).
Every variant is checked against float32 `F.linear` (relative error column).
Writes <out>/bench_gemv-<date>.{json,csv} with run_metadata(); prints a compact table.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import sys
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_kernels import ROTATE_BYTES, copy_bandwidth, time_calls  # noqa: E402

from swiftspec.files import atomic_write_text, run_metadata  # noqa: E402
from swiftspec.kernels.gemv import gemv  # noqa: E402

# Llama-3-8B per-layer linears (N, K) and the LM head
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
          "lm_head": (128256, 4096)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="1,2,4,8,16")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="small shapes (CPU smoke run)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = ap.parse_args()
    dev = args.device
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    shapes = {k: (max(16, n // 256), max(16, kk // 256)) for k, (n, kk) in SHAPES.items()} if args.quick else SHAPES
    bw = copy_bandwidth(dev)
    rows = []
    for m in [int(r) for r in args.rows.split(",")]:
        for name, (n, k) in shapes.items():
            wbytes = n * k * torch.tensor([], dtype=dtype).element_size()
            sets = max(1, min(32, math.ceil(ROTATE_BYTES / wbytes))) if dev == "cuda" else 1
            ws = [torch.empty((n, k), dtype=dtype, device=dev).normal_() for _ in range(sets)]
            x = torch.empty((m, k), dtype=dtype, device=dev).normal_()
            ref = F.linear(x.float(), ws[0].float())
            variants = {"cublas": lambda w, x=x: F.linear(x, w)}
            for bn in (8, 16, 32):
                variants[f"triton_bn{bn}"] = lambda w, bn=bn, x=x: gemv(x, w, block_n=bn)
            for impl, fn in variants.items():
                err = float((fn(ws[0]).float() - ref).abs().max() / ref.abs().max())
                us = time_calls([lambda w=w, fn=fn: fn(w) for w in ws], dev)
                floor = wbytes / bw * 1e6 if bw == bw else float("nan")
                rows.append({"rows": m, "layer": name, "n": n, "k": k, "impl": impl, "us": us, "floor_us": floor,
                             "x_floor": us / floor if floor == floor else float("nan"), "rel_err": err})
            del ws
            print(f"m={m} {name}: " + ", ".join(f"{r['impl']} {r['us']:.1f}" for r in rows[-len(variants):]),
                  flush=True)
    df = pd.DataFrame(rows)
    meta = {**run_metadata(dev), "copy_bandwidth_Bps": bw, "dtype": str(dtype).replace("torch.", ""),
            "weights": "random"}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"bench_gemv-{dt.date.today().isoformat()}"
    atomic_write_text(stem.with_suffix(".json"), json.dumps({"meta": meta, "rows": rows}, indent=1, default=str) + "\n")
    atomic_write_text(stem.with_suffix(".csv"), df.to_csv(index=False))
    print(df.pivot_table(index=["rows", "layer"], columns="impl", values="us").round(1).to_string())
    print(f"wrote {stem}.json and .csv")


if __name__ == "__main__":
    main()
