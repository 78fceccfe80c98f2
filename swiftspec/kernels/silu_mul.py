"""SwiGLU activation silu(gate) * up from the fused gate|up projection, in one Triton launch.

Eagerly `reference.silu_mul` is two kernels (silu on the gate half, then the multiply by the up half)
and a (T, F) intermediate. Here one program per (token, block of F columns) reads both halves and
writes the product. Numerics follow the eager ops: silu in float32 (x / (1 + exp(-x))) rounded to
the dtype, then the product in float32 rounded to the dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from swiftspec.kernels.pdl import check_pdl, grid_sync, launch_options, pdl_mode


@triton.jit
def _silu_mul_kernel(GU, OUT, F, stride_gu, stride_o, BLOCK: tl.constexpr, PDL: tl.constexpr):
    grid_sync(PDL)
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < F
    g = tl.load(GU + t * stride_gu + cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(GU + t * stride_gu + F + cols, mask=ok, other=0.0).to(tl.float32)
    s = (g / (1.0 + tl.exp(-g))).to(OUT.dtype.element_ty).to(tl.float32)
    tl.store(OUT + t * stride_o + cols, (s * u).to(OUT.dtype.element_ty), mask=ok)


def silu_mul(gate_up: torch.Tensor, *, out: torch.Tensor | None = None, pdl: bool | str = False) -> torch.Tensor:
    """(T, 2F) fused gate|up projection -> silu(gate) * up, (T, F), one launch.

    gate_up: last dim contiguous; gate is columns [0, F), up is [F, 2F). Returns a new tensor of
    gate_up's dtype (or writes `out`, a (T, F) buffer of that dtype). pdl: programmatic dependent
    launch (`swiftspec.kernels.pdl`; Hopper GPUs).
    Grid (T, ceil(F / BLOCK)); no host sync.
    """
    if gate_up.dim() != 2 or gate_up.shape[1] % 2 or gate_up.stride(-1) != 1:
        raise ValueError(f"gate_up must be (T, 2F) with a contiguous last dim, got {tuple(gate_up.shape)}")
    check_pdl(pdl, gate_up.device)
    t, f = gate_up.shape[0], gate_up.shape[1] // 2
    if out is None:
        out = torch.empty((t, f), dtype=gate_up.dtype, device=gate_up.device)
    elif out.shape != (t, f) or out.dtype != gate_up.dtype or out.stride(-1) != 1:
        raise ValueError(f"out must be ({t}, {f}) {gate_up.dtype} with a contiguous last dim")
    if t == 0 or f == 0:
        return out
    block = min(1024, triton.next_power_of_2(f))
    _silu_mul_kernel[(t, triton.cdiv(f, block))](gate_up, out, f, gate_up.stride(0), out.stride(0),
                                                 BLOCK=block, PDL=pdl_mode(pdl), num_warps=4, **launch_options(pdl))  # fmt: skip
    return out

