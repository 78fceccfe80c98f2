"""Warm the L2 cache with the next GEMM's weights while a latency-bound kernel runs (Hopper).

A batch-1 decode layer alternates bandwidth-bound GEMMs with kernels that barely touch HBM: tree
attention at a short prefix reads a few MB in 5-10 µs, then the o-projection streams its whole
weight (Llama-3-8B: 33.5 MB, ≈ 7.5 µs on an H200). While attention runs, HBM is almost idle. So
every attention program issues one bulk L2 prefetch (`cp.async.bulk.prefetch.L2.global`, sm_90)
of its share of the o-projection's weight, and the GEMM after it then reads from L2 what
attention's idle time already brought in. Only static weights are prefetched: they are the same
for every replay, so the prefetch may run before the kernel's grid dependency wait and never
races with data the previous kernel writes. A prefetch is a hint and changes no result.

Under TRITON_INTERPRET=1 (CPU tests) and before sm_90 there is no bulk prefetch: callers pass
PREFETCH=False there (`l2_prefetch_available`), and the helper compiles to nothing.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


@triton.jit
def l2_prefetch(PF, pf_bytes, pid, nprog, PREFETCH: tl.constexpr, LANES: tl.constexpr, BULK: tl.constexpr = True):
    """Program `pid` of `nprog` prefetches its share of the bytes [PF, PF + pf_bytes) into L2.
    BULK: in LANES bulk prefetches (one per thread: LANES = 32 * num_warps); else as 128-byte line
    prefetches (`prefetch.global.L2`), LANES lines per step. pf_bytes: a multiple of 16, PF
    16-byte aligned (`prefetch_span`). A no-op unless PREFETCH."""
    if PREFETCH:
        if BULK:
            share = tl.cdiv(tl.cdiv(pf_bytes, nprog), 16 * LANES) * (16 * LANES)
            lane_bytes = share // LANES
            start = pid.to(tl.int64) * share + tl.arange(0, LANES).to(tl.int64) * lane_bytes
            size = tl.minimum(lane_bytes, pf_bytes - start).to(tl.int32)  # <= 0: past the end, skipped
            ptrs = PF.to(tl.pointer_type(tl.int8)) + start
            tl.inline_asm_elementwise(
                "{ .reg .pred p; setp.gt.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
                "=r,l,r", [ptrs, size], dtype=tl.int32, is_pure=False, pack=1,
            )
        else:
            share = tl.cdiv(tl.cdiv(pf_bytes, nprog), 128) * 128
            base = PF.to(tl.pointer_type(tl.int8)) + pid.to(tl.int64) * share
            lines = tl.arange(0, LANES).to(tl.int64) * 128
            for off in range(0, share, 128 * LANES):
                at = pid.to(tl.int64) * share + off + lines
                tl.inline_asm_elementwise(
                    "{ .reg .pred p; setp.lt.s64 p, $2, $3; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
                    "=r,l,l,l", [base + off + lines, at, tl.zeros_like(at) + pf_bytes], dtype=tl.int32,
                    is_pure=False, pack=1,
                )


def l2_prefetch_available(device: torch.device | str) -> bool:
    """True where the bulk L2 prefetch exists: a CUDA device of compute capability >= 9.0, not
    Triton's CPU interpreter (which cannot run inline PTX)."""
    device = torch.device(device)
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def prefetch_span(weight: torch.Tensor | None, fraction: float = 1.0) -> int:
    """Bytes of `weight` (from its first element) a kernel may prefetch: `fraction` of its storage,
    rounded down to 16 bytes; 0 when there is nothing to prefetch (None, not contiguous, not
    16-byte aligned, not on a GPU that has the instruction)."""
    if weight is None or fraction <= 0 or not weight.is_contiguous() or weight.data_ptr() % 16:
        return 0
    if not l2_prefetch_available(weight.device):
        return 0
    nbytes = int(weight.numel() * weight.element_size() * min(fraction, 1.0))
    return min(nbytes, 2**31 - 16) // 16 * 16
