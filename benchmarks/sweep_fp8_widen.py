"""How to widen fp8 weights in the skinny linear, and whether to split K: the one-off sweep on the
H200 that chose `kernels.gemv`'s fp8 path (docs/decisions.md).

    python benchmarks/sweep_fp8_widen.py --out OUT_DIR --rows 1,16      # on the GPU, ~45 s

A stand-alone copy of the dot kernel with the choices as constexprs, on Llama-3-8B shapes, each
variant checked against its own torch reference (rel_err column):
  widen 0: e4m3 -> x's dtype (bfloat16) before tl.dot (the first fp8 kernel);
  widen 1: e4m3 and x -> float16 (adopted: e4m3 -> float16 is one instruction per two weights);
  widen 2: e4m3 bits -> bfloat16 by integer ops (exponent rebias by 120, zero kept; e4m3
           subnormals come out wrong: a speed probe only, run in the first sweep, not this one);
  widen 3: x quantized to e4m3 per 128-wide K tile, fp8 x fp8 tl.dot (W8A8, not weight-only:
           measured for comparison, not adopted; its reference quantizes x the same way).
split > 1: K split over programs, float32 atomics into a zeroed buffer, then a cast (the timing
includes the memset and the cast; `gemv` itself sums ordered partials instead, for determinism).
µs per call from bench_kernels.time_calls over rotated weight copies (cold weights).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_kernels import ROTATE_BYTES, copy_bandwidth, time_calls  # noqa: E402

from swiftspec.files import run_metadata  # noqa: E402
from swiftspec.kernels.gemv import quantize_fp8  # noqa: E402

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
          "lm_head": (128256, 4096)}
BF16_CONFIGS = [(bn, bk, ns, nw) for bn, bk, ns, nw in [(64, 256, 5, 4), (32, 256, 4, 4), (64, 128, 5, 4)]]
FP8_CONFIGS = [(64, 256, 3, 4), (64, 128, 4, 4), (128, 128, 3, 8)]
W8A8_CONFIGS = [(64, 128, 4, 4), (64, 128, 6, 4), (128, 128, 4, 4), (128, 128, 4, 8), (64, 128, 8, 4)]


@triton.jit
def _variant_kernel(X, W, S, Y, M, N, K, sx, sw, sy, WIDEN: tl.constexpr, SPLIT: tl.constexpr,
                    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, FP8: tl.constexpr, OTHER: tl.constexpr):
    cols = tl.program_id(0) * BN + tl.arange(0, BN)
    rows = tl.arange(0, BM)
    ok_n, ok_m = cols < N, rows < M
    acc = tl.zeros((BN, BM), dtype=tl.float32)
    k_per = tl.cdiv(tl.cdiv(K, SPLIT), BK) * BK
    k_lo = tl.program_id(1) * k_per
    k_hi = tl.minimum(K, k_lo + k_per)
    for k0 in range(k_lo, k_hi, BK):
        ks = k0 + tl.arange(0, BK)
        ok_k = ks < k_hi
        w = tl.load(W + cols[:, None].to(tl.int64) * sw + ks[None, :], mask=ok_n[:, None] & ok_k[None, :], other=OTHER)
        xt = tl.load(X + rows[None, :] * sx + ks[:, None], mask=ok_k[:, None] & ok_m[None, :], other=0.0)
        if FP8 and WIDEN == 3:
            x32 = xt.to(tl.float32)
            amax = tl.max(tl.abs(x32), axis=0)
            sxs = tl.where(amax > 0, amax / 448.0, 1.0)
            acc += tl.dot(w, (x32 / sxs[None, :]).to(tl.float8e4nv)) * sxs[None, :]
        else:
            if FP8 and WIDEN == 0:
                w = w.to(xt.dtype)
            elif FP8 and WIDEN == 1:
                w, xt = w.to(tl.float16), xt.to(tl.float16)
            elif FP8:
                b = w.to(tl.uint16)
                mag = b & 0x7F
                w = (((b & 0x80) << 8) | tl.where(mag == 0, 0, (mag << 4) + 15360)).to(tl.bfloat16, bitcast=True)
            acc = tl.dot(w, xt, acc)
    if FP8:
        acc *= tl.load(S + cols, mask=ok_n, other=0.0)[:, None]
    ptr = Y + rows[None, :] * sy + cols[:, None]
    if SPLIT == 1:
        tl.store(ptr, acc.to(Y.dtype.element_ty), mask=ok_n[:, None] & ok_m[None, :])
    else:
        tl.atomic_add(ptr, acc, mask=ok_n[:, None] & ok_m[None, :], sem="relaxed")


def run_variant(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None, widen: int, split: int, bn: int,
                bk: int, ns: int, nw: int) -> torch.Tensor:
    """x (M, K) @ w (N, K).T [* scale] by one variant -> (M, N) in x's dtype."""
    m, k = x.shape
    n = w.shape[0]
    fp8 = scale is not None
    if fp8 and widen == 2:
        w = w.view(torch.uint8)
    y = (torch.empty((m, n), dtype=x.dtype, device=x.device) if split == 1
         else torch.zeros((m, n), dtype=torch.float32, device=x.device))
    _variant_kernel[(triton.cdiv(n, bn), split)](
        x, w, scale if fp8 else x, y, m, n, k, x.stride(0), w.stride(0), y.stride(0), WIDEN=widen, SPLIT=split,
        BM=max(16, triton.next_power_of_2(m)), BN=bn, BK=bk, FP8=fp8, OTHER=0 if widen == 2 else 0.0,
        num_warps=nw, num_stages=ns)
    return y if split == 1 else y.to(x.dtype)


def w8a8_reference(x: torch.Tensor, w8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x quantized to e4m3 per (row, 128-wide K tile) as widen 3 does, then the dequantized product."""
    m, k = x.shape
    xb = x.float().view(m, k // 128, 128)
    sx = (xb.abs().amax(-1, keepdim=True) / 448.0).clamp_min(1e-30)
    xq = ((xb / sx).to(torch.float8_e4m3fn).float() * sx).view(m, k)
    return F.linear(xq, w8.float() * scale[:, None])


def sweep(rows: list[int], bw: float) -> list[dict]:
    res = []
    for m in rows:
        for name, (n, k) in SHAPES.items():
            sets = max(1, min(32, -(-ROTATE_BYTES // (n * k))))
            ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
            w8s = [quantize_fp8(w) for w in ws]
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            refs = {"bf16": F.linear(x.float(), ws[0].float()),
                    "fp8": F.linear(x.float(), w8s[0][0].float() * w8s[0][1][:, None]),
                    "w8a8": w8a8_reference(x, *w8s[0])}
            cfgs = [("bf16", 0, sp, *c) for sp in (1, 2) for c in BF16_CONFIGS]
            cfgs += [("fp8", wd, sp, *c) for wd in (0, 1) for sp in (1, 2, 4) for c in FP8_CONFIGS]
            cfgs += [("w8a8", 3, sp, *c) for sp in (1, 2, 4) for c in W8A8_CONFIGS]
            for kind, wd, sp, bn, bk, ns, nw in cfgs:
                row = dict(rows=m, layer=name, kind=kind, widen=wd, split=sp, bn=bn, bk=bk, ns=ns, nw=nw)

                def call(i, kind=kind, wd=wd, sp=sp, bn=bn, bk=bk, ns=ns, nw=nw, x=x, ws=ws, w8s=w8s):
                    if kind == "bf16":
                        return run_variant(x, ws[i], None, 0, sp, bn, bk, ns, nw)
                    return run_variant(x, w8s[i][0], w8s[i][1], wd, sp, bn, bk, ns, nw)

                try:
                    ref = refs[kind]
                    err = float((call(0).float() - ref).abs().max() / ref.abs().max())
                    us = time_calls([lambda i=i, call=call: call(i) for i in range(sets)], "cuda")
                except Exception as e:  # noqa: BLE001 - a config may not compile or fit: record it
                    res.append({**row, "error": str(e)[:200]})
                    continue
                floor = n * k * (2 if kind == "bf16" else 1) / bw * 1e6
                res.append({**row, "us": us, "floor_us": floor, "rel_err": err})
            del ws, w8s
            best = {}
            for r in res:
                if r["rows"] == m and r["layer"] == name and "us" in r:
                    key = (r["kind"], r["widen"])
                    best[key] = min(best.get(key, float("inf")), r["us"])
            print(f"m={m} {name}: " + ", ".join(f"{a}/{b} {v:.1f} us" for (a, b), v in best.items()), flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="1,16")
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("error: this sweep needs a CUDA GPU: run it on the GPU machine", file=sys.stderr)
        sys.exit(2)
    bw = copy_bandwidth("cuda")
    res = sweep([int(r) for r in args.rows.split(",")], bw)
    out = Path(args.out) / "fp8_widen_sweep.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": {**run_metadata("cuda"), "copy_bandwidth_Bps": bw}, "rows": res}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
