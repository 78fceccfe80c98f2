"""W4A16 skinny linear on one layer's shapes against its bytes floor and the bf16 and fp8 paths, in one run.

    python benchmarks/bench_w4a16.py --out DIR                    # on the GPU: < 2 minutes
    python benchmarks/bench_w4a16.py --model Llama-3-70B --tp 8 --out DIR   # a TP shard's linears
    TRITON_INTERPRET=1 python benchmarks/bench_w4a16.py --device cpu --rows 1,4 --quick --out /tmp/bw  # smoke

For each linear of one rank's layer of --model at --tp (`ModelSpec.linear_shapes`; Llama-3-8B at
TP 1 by default: qkv 6144 x 4096, o 4096 x 4096, gate_up 28672 x 4096, down 4096 x 14336) and each
row count (--rows, default 1..256) it times, as `bench_kernels.time_calls`
does (a CUDA graph of calls rotating over enough weight copies to stream cold weights past the L2):
bf16 weights through the skinny linear's default (`gemv`, up to 256 rows) and cuBLAS (`F.linear`);
fp8 weights through their default; int4 weights (`quantize_int4`, groups of 128) through the
default, x gathered each tile (`gather`) and one tile ahead (`ahead`) at every row count (the
default picks by rows: `gemv.int4_x_ahead_on`) and, unless --quick, the variants: 256-wide K steps
(two groups a tile, so every slice is dequantized instead of the group's scale applied once,
`bk256`), K split 1 / 2 / 4 / 8 / 16 ways (`k1`...; 128 weight rows over 8 warps), 64 weight rows
over 4 warps a program (`bn64`, split as the default, or `bn64_k1`...) and 128 rows over 8 warps
with x ahead (`bn128_ahead`). Each format's default also runs with its split-K partials summed
inside the launch (`*_combine`: `GemvLaunch(combine="kernel")`, where the default splits K; one
workspace for every call). floor_us = the variant's weight bytes (int4: packed ints + fp16 scales
+ zeros) / the device-to-device copy bandwidth measured in the same run. Every variant is checked
against float32 products of the weights it stands for (rel_err).
Writes DIR/bench_w4a16.csv and DIR/bench_w4a16.json (run_metadata, copy bandwidth, rows).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_kernels import time_calls  # noqa: E402
from bench_step import copy_bandwidth  # noqa: E402

from swiftspec.files import atomic_write_text, run_metadata  # noqa: E402
from swiftspec.kernels.counters import CounterWorkspace  # noqa: E402
from swiftspec.kernels.gemv import GemvLaunch, gemv, quantize_fp8  # noqa: E402
from swiftspec.kernels.int4 import dequantize, quantize_int4  # noqa: E402
from swiftspec.spec import ModelSpec  # noqa: E402

L2_BYTES = 60 << 20


def _variants(quick: bool) -> dict[str, GemvLaunch]:
    out = {"int4_default": GemvLaunch(), "int4_gather": GemvLaunch(int4_x_ahead=False),
           "int4_ahead": GemvLaunch(int4_x_ahead=True)}
    if not quick:
        out["int4_bk256"] = GemvLaunch(block_k=256)
        out.update({f"int4_k{k}": GemvLaunch(split_k=k) for k in (1, 2, 4, 8, 16)})
        out["int4_bn64"] = GemvLaunch(block_n=64, num_warps=4)
        out.update({f"int4_bn64_k{k}": GemvLaunch(block_n=64, num_warps=4, split_k=k) for k in (1, 2, 8, 16)})
        out["int4_bn128_ahead"] = GemvLaunch(block_n=128, num_warps=8, int4_x_ahead=True)
    return out


def _cases(x, ws: list, w8s: list, w4s: list, refs: tuple, quick: bool) -> dict:
    """variant -> (weight format, calls over the weight copies, one call, float32 reference)."""
    ref16, ref8, ref4 = refs
    w, (w8, s8), w4 = ws[0], w8s[0], w4s[0]
    kc = GemvLaunch(combine="kernel", workspace=CounterWorkspace(x.device))  # one workspace, as a model holds it
    cases = {
        "bf16_default": ("bf16", [lambda t=t: gemv(x, t) for t in ws], lambda: gemv(x, w), ref16),
        "bf16_combine": ("bf16", [lambda t=t: gemv(x, t, launch=kc) for t in ws], lambda: gemv(x, w, launch=kc), ref16),
        "bf16_cublas": ("bf16", [lambda t=t: F.linear(x, t) for t in ws], lambda: F.linear(x, w), ref16),
        "fp8_default": ("fp8", [lambda t=t: gemv(x, t[0], scale=t[1]) for t in w8s], lambda: gemv(x, w8, scale=s8),
                        ref8),
        "fp8_combine": ("fp8", [lambda t=t: gemv(x, t[0], scale=t[1], launch=kc) for t in w8s],
                        lambda: gemv(x, w8, scale=s8, launch=kc), ref8),
    }
    variants = {**_variants(quick), "int4_combine": kc}
    for v, lc in variants.items():
        cases[v] = ("int4", [lambda t=t, lc=lc: gemv(x, t, launch=lc) for t in w4s], lambda lc=lc: gemv(x, w4, launch=lc),
                    ref4)
    return cases


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--rows", default="1,2,4,8,16,32,64,128,256")
    ap.add_argument("--model", default="Llama-3-8B", help="bundled name or config folder")
    ap.add_argument("--tp", type=int, default=1, help="TP degree: one rank's shard of each linear")
    ap.add_argument("--layers", default="qkv,o,gate_up,down")
    ap.add_argument("--quick", action="store_true", help="defaults only, small shapes on CPU")
    args = ap.parse_args()
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    bw = copy_bandwidth(dev)
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s", flush=True)
    # the int4 shard: ffn padded to whole groups where TP does not divide it (`ModelSpec.shard`)
    shapes = dataclasses.replace(ModelSpec.from_config(args.model), weight_format="int4").linear_shapes(args.tp)
    if set(args.layers.split(",")) - set(shapes):
        ap.error(f"--layers: choose from {','.join(shapes)}")
    rows_out = []
    for name in args.layers.split(","):
        n, k = shapes[name]
        if not cuda:  # the interpreter: a sixteenth, whole packs and groups
            n, k = max(8, n // 128 * 8), max(128, k // 2048 * 128)
        gen = torch.Generator(dev).manual_seed(0)
        w = (torch.randn(n, k, generator=gen, device=dev) * 0.02).to(dtype)
        w8, s8 = quantize_fp8(w)
        w4 = quantize_int4(w, 128)
        deq4, deq8 = dequantize(w4).float(), w8.float() * s8[:, None]
        bytes_ = {"bf16": n * k * w.element_size(), "fp8": n * k + 4 * n, "int4": w4.nbytes()}
        # copies so one graph replay streams > 2x the L2 from HBM (cold weights, as in a step)
        copies = max(1, -(-2 * L2_BYTES // bytes_["int4"])) if cuda else 1
        w4s = [w4] + [type(w4)(w4.qweight.clone(), w4.scales.clone(), w4.zeros.clone(), w4.group_size)
                      for _ in range(copies - 1)]
        c16 = max(1, -(-2 * L2_BYTES // bytes_["bf16"])) if cuda else 1
        ws = [w] + [w.clone() for _ in range(c16 - 1)]
        c8 = max(1, -(-2 * L2_BYTES // bytes_["fp8"])) if cuda else 1
        w8s = [(w8, s8)] + [(w8.clone(), s8.clone()) for _ in range(c8 - 1)]
        for m in (int(r) for r in args.rows.split(",")):
            x = (torch.randn(m, k, generator=gen, device=dev)).to(dtype)
            ref16, ref8, ref4 = (x.float() @ t.t() for t in (w.float(), deq8, deq4))
            cases = _cases(x, ws, w8s, w4s, (ref16, ref8, ref4), args.quick)
            for v, (fmt, calls, one, ref) in cases.items():
                try:
                    err = float((one().float() - ref).abs().max() / ref.abs().max())
                    us = time_calls(calls, dev.type)
                except Exception as e:  # a variant that does not compile here: recorded, not fatal
                    rows_out.append(dict(layer=name, n=n, k=k, rows=m, variant=v, error=f"{type(e).__name__}: {e}"[:200]))
                    continue
                floor = bytes_[fmt] / bw * 1e6
                rows_out.append(dict(layer=name, n=n, k=k, rows=m, variant=v, format=fmt, us=us, floor_us=floor,
                                     x_floor=us / floor, bytes=bytes_[fmt], rel_err=err))
            print(f"{name} M={m}: " + ", ".join(f"{r['variant']} {r['us']:.1f}us ({r['x_floor']:.2f}x)"
                                               for r in rows_out if r.get("rows") == m and r["layer"] == name
                                               and "us" in r), flush=True)
    out = Path(args.out)
    df = pd.DataFrame(rows_out)
    atomic_write_text(out / "bench_w4a16.csv", df.to_csv(index=False))
    meta = {**run_metadata(args.device), "copy_bandwidth_Bps": bw, "weights": "random", "group_size": 128,
            "model": args.model, "tp": args.tp}
    atomic_write_text(out / "bench_w4a16.json", json.dumps({"meta": meta, "rows": rows_out}, indent=1) + "\n")
    if "us" in df:
        step = df.dropna(subset=["us"]).groupby(["rows", "variant"])[["us", "floor_us"]].sum()
        step["x_floor"] = step["us"] / step["floor_us"]
        with pd.option_context("display.width", 200, "display.max_rows", 200, "display.float_format", "{:.2f}".format):
            print("\none layer's four linears (sum of µs)\n" + step["us"].unstack().to_string()
                  + "\n\nx floor\n" + step["x_floor"].unstack().to_string())


if __name__ == "__main__":
    main()
