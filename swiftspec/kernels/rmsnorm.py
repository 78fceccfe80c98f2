"""Fused residual add + RMSNorm in Triton: one launch where eager PyTorch issues ~8-9.

A decoder layer adds each sublayer's output to the residual stream and normalises the sum for the
next sublayer. Eagerly that is an add, then RMSNorm as Hugging Face computes it (cast to float32,
square, mean, add eps, rsqrt, multiply, cast back, multiply by the weight): about nine kernels of a
few KB each, i.e. pure launch latency at batch 1. `add_rmsnorm` does all of it in one program per
token row.

Numerics reproduce `reference.add_rmsnorm_ref` (the model's `rms_norm` of `residual + x`) step for step,
including every rounding to the model dtype: the sum is rounded to the dtype (it becomes the new
residual), the statistics are float32, the normalised row is rounded to the dtype, then multiplied
by the weight and rounded again. In float32 the only difference is the summation order of the
mean of squares (~1e-7 relative); in bf16/fp16 the results agree to that plus rare 1-ulp flips.

Graph safety: one launch whose grid depends only on shapes; no host sync.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from swiftspec.kernels.pdl import check_pdl, grid_sync, launch_options, pdl_mode


@triton.jit
def _add_rmsnorm_kernel(
    X, RES, W, OUT, NEW_RES, N, eps,
    stride_x, stride_r, stride_o, stride_nr,
    BLOCK: tl.constexpr, HAS_RES: tl.constexpr, PDL: tl.constexpr,
):
    """Program t: row t of OUT = rmsnorm(X[t] (+ RES[t])) * W; NEW_RES[t] = X[t] + RES[t]."""
    grid_sync(PDL)
    t = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    ok = offs < N
    x = tl.load(X + t * stride_x + offs, mask=ok, other=0.0)
    if HAS_RES:
        r = tl.load(RES + t * stride_r + offs, mask=ok, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(X.dtype.element_ty)  # the dtype add of eager
        tl.store(NEW_RES + t * stride_nr + offs, x, mask=ok)
    xf = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, axis=0) / N + eps)
    y = (xf * rstd).to(X.dtype.element_ty)  # rms_norm casts back before the weight multiply
    w = tl.load(W + offs, mask=ok, other=0.0)
    out = (y.to(tl.float32) * w.to(tl.float32)).to(OUT.dtype.element_ty)
    tl.store(OUT + t * stride_o + offs, out, mask=ok)


def add_rmsnorm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    *,
    out: torch.Tensor | None = None,
    residual_out: torch.Tensor | None = None,
    pdl: bool | str = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(normed, new_residual) with new_residual = residual + x (x itself when residual is None) and
    normed = RMSNorm(new_residual) * weight, in one launch.

    Shapes:
        x:        (T, H) sublayer output (or the embeddings for the first layer), last dim contiguous
        residual: (T, H) residual stream, same dtype, or None (first layer: nothing to add)
        weight:   (H,) norm weight, same dtype
        out, residual_out: optional (T, H) buffers to write into (static buffers; tests poison them)
        pdl: programmatic dependent launch (`swiftspec.kernels.pdl`; Hopper GPUs)
    Returns:
        normed (T, H) and new_residual (T, H), both in x.dtype; new tensors (x and residual are not
        modified), except that new_residual *is* x when residual is None.
    Float32 statistics; roundings to x.dtype where `reference.add_rmsnorm_ref` rounds.
    """
    if x.dim() != 2 or weight.shape != (x.shape[1],):
        raise ValueError(f"x must be (T, H) with weight (H,), got {tuple(x.shape)} and {tuple(weight.shape)}")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(f"residual must match x: {tuple(residual.shape)} {residual.dtype} vs "
                         f"{tuple(x.shape)} {x.dtype}")  # fmt: skip
    if x.stride(-1) != 1 or weight.stride(-1) != 1 or (residual is not None and residual.stride(-1) != 1):
        raise ValueError("x, residual and weight need a contiguous last dimension")
    check_pdl(pdl, x.device)
    t, h = x.shape
    out = _buffer(out, x)
    new_res = _buffer(residual_out, x) if residual is not None else x
    if t == 0:
        return out, new_res
    block = triton.next_power_of_2(h)
    # One row per program; warps so each thread holds <= 16 float32 values of the row (no spills).
    num_warps = min(16, max(1, block // 512))
    res = residual if residual is not None else x
    _add_rmsnorm_kernel[(t,)](
        x, res, weight, out, new_res, h, float(eps),
        x.stride(0), res.stride(0), out.stride(0), new_res.stride(0),
        BLOCK=block, HAS_RES=residual is not None, PDL=pdl_mode(pdl), num_warps=num_warps, **launch_options(pdl),
    )
    return out, new_res


def _buffer(buf: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    if buf is None:
        return torch.empty_like(like)
    if buf.shape != like.shape or buf.dtype != like.dtype or buf.stride(-1) != 1:
        raise ValueError(f"output buffer must be {tuple(like.shape)} {like.dtype} with a contiguous last dim")
    return buf

