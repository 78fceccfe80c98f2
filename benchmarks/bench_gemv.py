"""Skinny linear (M = 1..16 token rows) on Llama-3-8B shapes: Triton `gemv` vs cuBLAS `F.linear`
vs the weight-bytes floor.

    python benchmarks/bench_gemv.py                                   # on the H200: < 1 minute
    TRITON_INTERPRET=1 python benchmarks/bench_gemv.py --quick --device cpu --out /tmp/bg   # smoke

Each call is captured in a CUDA graph that rotates over enough weight copies to touch > 2x the
60 MB L2 per replay (each call streams cold weights, as in the step); µs per call = median replay
time / calls. Floor = weight bytes / device-to-device copy bandwidth measured in the same run.
Variants: cuBLAS (`F.linear`); kind "fma" (broadcast multiply-sum; 1 row only: it is many times
cuBLAS's time at 4-16 rows) at BLOCK_N 2/4/8 x num_warps 1/2/4, named
`fma_bn{N}_w{warps}`; kind "dot" (`tl.dot`, rows padded to 16) at BLOCK_N 64/128 x BLOCK_K
64/128/256 (`--block-k`) x num_stages 3/5 (`--stages`), named `dot_bn{N}_bk{K}_s{stages}` (`--warps
4,8`: also over num_warps, `..._w{warps}`; `--split-k 1,2,4`: also over split_k, `..._k{split}`;
`--block-n 128`: only those BLOCK_N). `--quick`: one config of each; `--layers qkv,o`: only those.
Every variant is checked against float32 `F.linear` (relative error column). `--fp8`: the same
weights quantized (`quantize_fp8`) through the dot kernel, `fp8_default` (gemv's own config),
`fp8_default_x16` (the same with x converted to float16 once, `GemvLaunch(x_f16=True)`) and
`fp8_dot_bn{N}_bk{K}_s{stages}_w{warps}_k{split_k}`, against the
dequantized weights and a floor of one byte per weight; it also runs more than 16 rows.
`--shapes 70b-tp8,1b` picks other shape sets (one TP-8 shard of Llama-3-70B, Llama-3.2-1B; layer
names then carry `@set`); `--defaults-only` replaces the sweep by cuBLAS, gemv's own config
(`dot_default`), it split over K in 2 and 4 (`dot_default_k2/k4`) and it with the add+RMSNorm
folded in (`dot_fold`: `Epilogue(rms_eps=, residual=)`, split by the same rule; `dot_fold_k1`
forced unsplit; both checked against the product of RMSNorm(x + r) and w), to ask where narrow
shard GEMMs lose. `dot_default` is gemv's default at the time of the run.
`--split-sweep` runs cuBLAS, `dot_default` and `dot_default_k1/k2/k4` (K forced unsplit, in 2, in
4) at any --rows, to place the split rule; shape sets 1b-tp2, 3b, 8b-tp2 and 70b-tp4 add the shards the
planner picks.
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
from swiftspec.kernels.gemv import Epilogue, GemvLaunch, gemv, quantize_fp8  # noqa: E402

# per-layer linears (N, K) and the LM head: Llama-3-8B, one TP-8 shard of Llama-3-70B, Llama-3.2-1B
SHAPE_SETS = {
    "8b": {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
           "lm_head": (128256, 4096)},
    "70b-tp8": {"qkv": (1280, 8192), "o": (8192, 1024), "gate_up": (7168, 8192), "down": (8192, 3584),
                "lm_head": (16032, 8192)},
    "1b": {"qkv": (3072, 2048), "o": (2048, 2048), "gate_up": (16384, 2048), "down": (2048, 8192),
           "lm_head": (128256, 2048)},
    "1b-tp2": {"qkv": (1536, 2048), "o": (2048, 1024), "gate_up": (8192, 2048), "down": (2048, 4096),
               "lm_head": (64128, 2048)},
    "3b": {"qkv": (5120, 3072), "o": (3072, 3072), "gate_up": (16384, 3072), "down": (3072, 8192),
           "lm_head": (128256, 3072)},
    "8b-tp2": {"qkv": (3072, 4096), "o": (4096, 2048), "gate_up": (14336, 4096), "down": (4096, 7168),
               "lm_head": (64128, 4096)},
    "70b-tp4": {"qkv": (2560, 8192), "o": (8192, 2048), "gate_up": (14336, 8192), "down": (8192, 7168),
                "lm_head": (32064, 8192)},
}
SHAPES = SHAPE_SETS["8b"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="1,2,4,8,16")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="small shapes (CPU smoke run)")
    ap.add_argument("--fp8", action="store_true",
                    help="also fp8 weights (quantize_fp8) through the dot kernel, up to 256 rows (--rows 1,16,64,256)")
    ap.add_argument("--shapes", default="8b", help=f"shape set(s), comma-separated: {', '.join(SHAPE_SETS)}")
    ap.add_argument("--defaults-only", action="store_true",
                    help="only cuBLAS, gemv's own config, it split over K in 2 and 4 (split_k), and it with the "
                         "add+RMSNorm folded in (rms_eps + residual), instead of the config sweep")
    ap.add_argument("--split-sweep", action="store_true",
                    help="only cuBLAS, gemv's own config and it with K split in 1, 2 and 4 (split_k), "
                         "to place the split rule (any --rows)")
    ap.add_argument("--warps", default="",
                    help="the tile sweep also over these num_warps (e.g. 4,8; names gain _w{N}); default: gemv's own")
    ap.add_argument("--stages", default="3,5", help="num_stages of the tile sweep (default 3,5)")
    ap.add_argument("--block-k", default="64,128,256", help="BLOCK_K of the tile sweep (default 64,128,256)")
    ap.add_argument("--split-k", default="",
                    help="the tile sweep also over these split_k (e.g. 1,2,4; names gain _k{N}); default: gemv's own")
    ap.add_argument("--block-n", default="64,128", help="BLOCK_N of the tile sweep (default 64,128)")
    ap.add_argument("--layers", default="", help="only these layers of the shape sets (e.g. qkv,o,gate_up,down)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = ap.parse_args()
    dev = args.device
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    unknown = [s for s in args.shapes.split(",") if s not in SHAPE_SETS]
    if unknown:
        print(f"error: unknown shape set {unknown[0]!r}: choose from {', '.join(SHAPE_SETS)}", file=sys.stderr)
        sys.exit(2)
    layers = [v for v in args.layers.split(",") if v]
    try:  # the tile sweep's lists, checked before any GPU work
        warps = [int(v) for v in args.warps.split(",") if v] or [None]
        stages = [int(v) for v in args.stages.split(",") if v]
        block_ks = [int(v) for v in args.block_k.split(",") if v]
        block_ns = [int(v) for v in args.block_n.split(",") if v]
        splits = [int(v) for v in args.split_k.split(",") if v] or [None]
    except ValueError:
        ap.error("--warps, --stages, --block-k, --block-n and --split-k take comma-separated integers, e.g. --stages 3,5")
    picked = {(f"{k}@{s}" if "," in args.shapes else k): v for s in args.shapes.split(",")
              for k, v in SHAPE_SETS[s].items() if not layers or k in layers}
    if not picked:
        print(f"error: no layer named {args.layers!r}: choose from {', '.join(SHAPES)}", file=sys.stderr)
        sys.exit(2)
    shapes = {k: (max(64, n // 256), max(64, kk // 256)) for k, (n, kk) in picked.items()} if args.quick else picked
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
            if args.defaults_only or args.split_sweep:
                variants["dot_default"] = lambda w, x=x: gemv(x, w)
                for sk in (1, 2, 4) if args.split_sweep else (2, 4):
                    variants[f"dot_default_k{sk}"] = lambda w, sk=sk, x=x: gemv(x, w, launch=GemvLaunch(split_k=sk))
            if args.defaults_only:
                r, r_out = torch.empty_like(x).normal_(), torch.empty_like(x)
                # the fold: x + r normalized inside the launch (its norm weight folded into w
                # beforehand, so the reference is the plain product of RMSNorm(x + r) and w)
                fold = Epilogue(rms_eps=1e-5, residual=r, residual_out=r_out)
                variants["dot_fold"] = lambda w, x=x, fold=fold: gemv(x, w, epilogue=fold)
                # the fold forced unsplit
                variants["dot_fold_k1"] = lambda w, x=x, fold=fold: gemv(x, w, epilogue=fold,
                                                                        launch=GemvLaunch(split_k=1))
                h = x.float() + r.float()
                refs = dict.fromkeys(("dot_fold", "dot_fold_k1"),
                                     F.linear(h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5), ws[0].float()))
            else:
                refs = {}
            sweep = not (args.defaults_only or args.split_sweep)
            for bn, nw in [] if not sweep else [(8, 4)] if args.quick else [
                    (b, n) for b in (2, 4, 8) for n in (1, 2, 4)]:
                if m == 1:
                    variants[f"fma_bn{bn}_w{nw}"] = lambda w, bn=bn, nw=nw, x=x: gemv(
                        x, w, kind="fma", launch=GemvLaunch(block_n=bn, num_warps=nw))
            for bn, bk, ns, nw, sk in [] if not sweep else [(64, 128, 3, None, None)] if args.quick else [
                    (b, k, s, n, q) for b in block_ns for k in block_ks for s in stages for n in warps for q in splits]:
                variants[f"dot_bn{bn}_bk{bk}_s{ns}" + (f"_w{nw}" if nw else "") + (f"_k{sk}" if sk else "")] = (
                    lambda w, bn=bn, bk=bk, ns=ns, nw=nw, sk=sk, x=x: gemv(x, w, kind="dot", launch=GemvLaunch(
                        block_n=bn, block_k=bk, num_stages=ns, num_warps=nw, split_k=sk)))
            # fp8 weights (`--fp8`): the same random weights quantized per row, against their own
            # floor (one byte per weight) and their own reference (the dequantized weights)
            w8s = [quantize_fp8(w) for w in ws] if args.fp8 else []
            ref8 = F.linear(x.float(), w8s[0][0].float() * w8s[0][1][:, None]) if w8s else None
            fp8_variants = {} if not w8s else {"fp8_default": lambda w, x=x: gemv(x, w[0], scale=w[1]),
                                               "fp8_default_x16": lambda w, x=x: gemv(
                                                   x, w[0], scale=w[1], launch=GemvLaunch(x_f16=True))}
            for bn, bk, ns, nw, sk in [] if not w8s else [(64, 128, 3, 4, 1)] if args.quick else [
                    (64, 128, 4, 4, 1), (64, 128, 4, 4, 2), (64, 128, 4, 4, 4), (64, 256, 3, 4, 4),
                    (128, 128, 3, 8, 1), (128, 128, 3, 8, 4), (64, 64, 5, 4, 1)]:
                fp8_variants[f"fp8_dot_bn{bn}_bk{bk}_s{ns}_w{nw}_k{sk}"] = (
                    lambda w, bn=bn, bk=bk, ns=ns, nw=nw, sk=sk, x=x: gemv(x, w[0], scale=w[1], launch=GemvLaunch(
                        block_n=bn, block_k=bk, num_stages=ns, num_warps=nw, split_k=sk)))
            n_before = len(rows)
            for impl, fn, weights, reference, nbytes in (
                    [(i, f, ws, refs.get(i, ref), wbytes) for i, f in variants.items()]
                    + [(i, f, w8s, ref8, n * k) for i, f in fp8_variants.items()]):  # fmt: skip
                try:  # a config may not fit (shared memory): record it and go on
                    err = float((fn(weights[0]).float() - reference).abs().max() / reference.abs().max())
                    us = time_calls([lambda w=w, fn=fn: fn(w) for w in weights], dev)
                except Exception as e:  # noqa: BLE001
                    rows.append({"rows": m, "layer": name, "n": n, "k": k, "impl": impl, "error": str(e)[:120]})
                    continue
                floor = nbytes / bw * 1e6 if bw == bw else float("nan")
                rows.append({"rows": m, "layer": name, "n": n, "k": k, "impl": impl, "us": us, "floor_us": floor,
                             "x_floor": us / floor if floor == floor else float("nan"), "rel_err": err})
            del ws, w8s
            done = [r for r in rows[n_before:] if "us" in r and not r["impl"].startswith("fp8")]
            best = min(done[1:], key=lambda r: r["us"], default=done[0]) if done else None
            fp8_done = [r for r in rows[n_before:] if "us" in r and r["impl"].startswith("fp8")]
            if best is not None:
                print(f"m={m} {name}: floor {done[0]['floor_us']:.1f} cublas {done[0]['us']:.1f} "
                      f"best {best['impl']} {best['us']:.1f} us", flush=True)
            if fp8_done:
                b8 = min(fp8_done, key=lambda r: r["us"])
                print(f"m={m} {name}: fp8 floor {b8['floor_us']:.1f} best {b8['impl']} {b8['us']:.1f} us", flush=True)
    df = pd.DataFrame(rows)
    meta = {**run_metadata(dev), "copy_bandwidth_Bps": bw, "dtype": str(dtype).replace("torch.", ""),
            "weights": "random"}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"bench_gemv-{dt.date.today().isoformat()}"
    atomic_write_text(stem.with_suffix(".json"), json.dumps({"meta": meta, "rows": rows}, indent=1, default=str) + "\n")
    atomic_write_text(stem.with_suffix(".csv"), df.to_csv(index=False))
    df = df[df["us"].notna()] if "error" in df else df
    is_fp8 = df["impl"].str.startswith("fp8")
    fp8, df = df[is_fp8], df[~is_fp8]
    tri = df[df["impl"] != "cublas"]
    best = tri.loc[tri.groupby(["rows", "layer"])["us"].idxmin()].set_index(["rows", "layer"])
    cub = df[df["impl"] == "cublas"].set_index(["rows", "layer"])
    print(pd.DataFrame({"floor_us": cub["floor_us"], "cublas_us": cub["us"], "best_triton": best["impl"],
                        "triton_us": best["us"], "cublas_x_floor": cub["x_floor"],
                        "triton_x_floor": best["x_floor"]}).round(2).to_string())
    per_cfg = tri.groupby("impl")["x_floor"].median().sort_values()
    print("median x floor per config over all shapes:\n" + per_cfg.round(3).to_string())
    if len(fp8):
        b8 = fp8.loc[fp8.groupby(["rows", "layer"])["us"].idxmin()].set_index(["rows", "layer"])
        print("fp8 weights (floor: one byte per weight):\n"
              + b8[["impl", "us", "floor_us", "x_floor", "rel_err"]].round(3).to_string())
    print(f"wrote {stem}.json and .csv")


if __name__ == "__main__":
    main()
