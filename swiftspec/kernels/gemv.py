"""Skinny linear layer y = x @ w.T (+ b) for a few token rows (M <= 16), in one Triton launch.

Why: on the H200 the decode step's GEMMs alone (cuBLAS, one CUDA graph) take 1.16x the weight-bytes
floor at 1 token and 1.25x at 64 (`benchmarks/results/bench_step_kernels-2026-12-02.*`), so the
issue-3 goal of 1.15x for the whole step cannot be met with them. A batch-1 linear is a pure
weight stream: every weight is read once, the x rows are tiny and stay in L1/L2.

Design: one program per BLOCK_N output columns (w rows), all M token rows at once, a loop over K
in BLOCK_K chunks: load a (BLOCK_N, BLOCK_K) weight tile and the (BLOCK_M, BLOCK_K) x tile,
accumulate (BLOCK_M, BLOCK_N) in float32 by a broadcast multiply and a sum over K (no tensor
cores: at M <= 16 the kernel is bandwidth-bound and the tiles stay small). BLOCK_M x BLOCK_N x
BLOCK_K is kept at 8192 products per program step so registers do not spill. Many programs (N /
BLOCK_N: 256 for N = 4096 at BLOCK_N 16) keep enough loads in flight without split-K.

Status: written and tested against `F.linear` under the CPU interpreter; not yet measured on a GPU
and not wired into the model (`benchmarks/bench_gemv.py` measures it against cuBLAS and the floor).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

MAX_ROWS = 16  # more token rows: use F.linear (cuBLAS is efficient once M fills an MMA tile)


@triton.jit
def _gemv_kernel(X, W, B, Y, M, N, K, stride_x, stride_w, stride_y, HAS_BIAS: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.arange(0, BLOCK_M)
    ok_n, ok_m = cols < N, rows < M
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        ok_k = ks < K
        w = tl.load(W + cols[:, None].to(tl.int64) * stride_w + ks[None, :], mask=ok_n[:, None] & ok_k[None, :],
                    other=0.0).to(tl.float32)  # (BLOCK_N, BLOCK_K)
        x = tl.load(X + rows[:, None] * stride_x + ks[None, :], mask=ok_m[:, None] & ok_k[None, :],
                    other=0.0).to(tl.float32)  # (BLOCK_M, BLOCK_K)
        acc += tl.sum(x[:, None, :] * w[None, :, :], axis=2)
    if HAS_BIAS:
        acc += tl.load(B + cols, mask=ok_n, other=0.0).to(tl.float32)[None, :]
    tl.store(Y + rows[:, None] * stride_y + cols[None, :], acc.to(Y.dtype.element_ty),
             mask=ok_m[:, None] & ok_n[None, :])


def gemv_config(m: int, block_n: int | None = None, block_k: int | None = None) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K) for m token rows: 8192 products per K step unless overridden."""
    bm = triton.next_power_of_2(max(1, m))
    bn = block_n or 16
    bk = block_k or max(16, 8192 // (bm * bn))
    return bm, bn, bk


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
         block_n: int | None = None, block_k: int | None = None, num_warps: int = 4) -> torch.Tensor:
    """x (M, K) @ weight (N, K).T + bias (N,) -> (M, N) in x's dtype, float32 accumulation.

    M <= 16 (MAX_ROWS); x and weight need a contiguous last dim. One launch, grid ceil(N / BLOCK_N);
    no host sync, so it can be captured in a CUDA graph.
    """
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"need x (M, K) and weight (N, K), got {tuple(x.shape)} and {tuple(weight.shape)}")
    m, k = x.shape
    n = weight.shape[0]
    if m > MAX_ROWS:
        raise ValueError(f"gemv takes at most {MAX_ROWS} rows, got {m}: use F.linear")
    if x.stride(-1) != 1 or weight.stride(-1) != 1:
        raise ValueError("x and weight need a contiguous last dim")
    if bias is not None and bias.shape != (n,):
        raise ValueError(f"bias must be ({n},), got {tuple(bias.shape)}")
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return y
    bm, bn, bk = gemv_config(m, block_n, block_k)
    _gemv_kernel[(triton.cdiv(n, bn),)](
        x, weight, bias if bias is not None else weight, y, m, n, k, x.stride(0), weight.stride(0), y.stride(0),
        HAS_BIAS=bias is not None, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=num_warps,
    )
    return y


def gemv_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Pure-torch reference: the model's `F.linear`."""
    return F.linear(x, weight, bias)
