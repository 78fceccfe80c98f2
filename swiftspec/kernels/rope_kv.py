"""RoPE on q and k plus the KV-cache write, in one Triton launch per layer.

Eagerly a layer rotates q and k with ~5 kernels each (negate, concatenate, two multiplies, add:
`reference.apply_rope`) and then scatters k and v into the cache slots (two index_put kernels, plus
copies of the transposed views). `rope_kv` reads the fused qkv projection once and writes the
rotated q (for attention), the rotated k and the untouched v (into the cache) from one launch.

Grid (T, Hq + Hkv): program (t, h) rotates query head h of token t, or, for h >= Hq, rotates key
head h - Hq and copies the matching value head, storing both at cache slot slots[t]. cos/sin are the
(T, D) rows the model builds once per forward (positions x inv_freq, with the checkpoint's RoPE
scaling already in inv_freq), so any scaling works unchanged and the kernel does no transcendental
math.

Numerics follow `reference.apply_rope` (rotate-half, x * cos + rotate_half(x) * sin) with its roundings
to the model dtype after each multiply and after the add; float32 is exact up to fused
multiply-adds on the GPU.

Graph safety: slots are read in the kernel (device tensor, no host sync); the grid depends only on
shapes. Slots are not range-checked (that would need a sync): they must lie in [0, S).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from swiftspec.kernels.pdl import check_pdl, grid_sync, launch_options, pdl_mode


@triton.jit
def _rotate(base, cos_row, sin_row, offs, ok, HALF: tl.constexpr):
    """Rotate-half RoPE of one head at `base` (D = 2 * HALF values) -> (first half, second half),
    rounded to the input dtype after each multiply and the add, as eager bf16/fp16 ops round."""
    dt = base.dtype.element_ty
    x1 = tl.load(base + offs, mask=ok, other=0.0)
    x2 = tl.load(base + HALF + offs, mask=ok, other=0.0)
    c1 = tl.load(cos_row + offs, mask=ok, other=0.0).to(tl.float32)
    c2 = tl.load(cos_row + HALF + offs, mask=ok, other=0.0).to(tl.float32)
    s1 = tl.load(sin_row + offs, mask=ok, other=0.0).to(tl.float32)
    s2 = tl.load(sin_row + HALF + offs, mask=ok, other=0.0).to(tl.float32)
    x1 = x1.to(tl.float32)
    x2 = x2.to(tl.float32)
    # out[:half] = x1 * cos - x2 * sin ; out[half:] = x2 * cos + x1 * sin  (rot = cat(-x2, x1))
    a1 = (x1 * c1).to(dt).to(tl.float32)
    b1 = (x2 * s1).to(dt).to(tl.float32)
    a2 = (x2 * c2).to(dt).to(tl.float32)
    b2 = (x1 * s2).to(dt).to(tl.float32)
    return (a1 - b1).to(dt), (a2 + b2).to(dt)


@triton.jit
def _rope_kv_kernel(
    QKV, COS, SIN, SLOTS, QOUT, KC, VC, HQ, HKV,
    stride_qkv, stride_cos, stride_sin, stride_qo_t, stride_qo_h,
    stride_kc_h, stride_kc_s, stride_vc_h, stride_vc_s,
    HALF: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
):
    grid_sync(PDL)
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    offs = tl.arange(0, BLOCK)
    ok = offs < HALF
    row = QKV + t * stride_qkv
    cos_row = COS + t * stride_cos
    sin_row = SIN + t * stride_sin
    if h < HQ:
        o1, o2 = _rotate(row + h * (2 * HALF), cos_row, sin_row, offs, ok, HALF)
        dst = QOUT + t * stride_qo_t + h * stride_qo_h
        tl.store(dst + offs, o1, mask=ok)
        tl.store(dst + HALF + offs, o2, mask=ok)
    else:
        j = h - HQ
        slot = tl.load(SLOTS + t).to(tl.int64)
        o1, o2 = _rotate(row + (HQ + j) * (2 * HALF), cos_row, sin_row, offs, ok, HALF)
        kdst = KC + j * stride_kc_h + slot * stride_kc_s
        tl.store(kdst + offs, o1, mask=ok)
        tl.store(kdst + HALF + offs, o2, mask=ok)
        vsrc = row + (HQ + HKV + j) * (2 * HALF)
        vdst = VC + j * stride_vc_h + slot * stride_vc_s
        tl.store(vdst + offs, tl.load(vsrc + offs, mask=ok), mask=ok)
        tl.store(vdst + HALF + offs, tl.load(vsrc + HALF + offs, mask=ok), mask=ok)


def _check(qkv, cos, sin, slots, k_cache, v_cache, q_heads, kv_heads) -> int:
    """Validate shapes (host-side metadata only, no sync); return the head dim D."""
    if k_cache.dim() != 3 or v_cache.shape != k_cache.shape:
        raise ValueError(f"k_cache, v_cache must be (Hkv, S, D) of one shape, got {tuple(k_cache.shape)}, "
                         f"{tuple(v_cache.shape)}")  # fmt: skip
    hkv, _s, d = k_cache.shape
    t = qkv.shape[0]
    if hkv != kv_heads or d % 2:
        raise ValueError(f"cache has {hkv} KV heads of dim {d}; expected {kv_heads} heads of an even dim")
    if qkv.dim() != 2 or qkv.shape[1] != (q_heads + 2 * kv_heads) * d:
        want = (q_heads + 2 * kv_heads) * d
        raise ValueError(f"qkv must be (T, (Hq + 2 Hkv) * D) = (T, {want}), got {tuple(qkv.shape)}")
    if cos.shape != (t, d) or sin.shape != (t, d):
        raise ValueError(f"cos and sin must be (T, D) = ({t}, {d}), got {tuple(cos.shape)}, {tuple(sin.shape)}")
    if slots.shape != (t,) or slots.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"slots must be ({t},) int32/int64, got {tuple(slots.shape)} {slots.dtype}")
    if any(x.stride(-1) != 1 for x in (qkv, cos, sin, k_cache, v_cache)) or k_cache.dtype != qkv.dtype:
        raise ValueError("qkv, cos, sin and the caches need a contiguous last dim; caches in qkv's dtype")
    return d


def rope_kv(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    slots: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    q_heads: int,
    kv_heads: int,
    *,
    out: torch.Tensor | None = None,
    pdl: bool | str = False,
) -> torch.Tensor:
    """Rotate q and k of the fused projection, write k and v into the cache at `slots`; return q.

    Shapes:
        qkv:      (T, (Hq + 2 Hkv) * D) fused projection: q heads, then k heads, then v heads
        cos, sin: (T, D) rows for each token's position (`Transformer.forward` builds them), qkv dtype
        slots:    (T,) int64/int32 cache slots on the device (read in the kernel: graph-safe)
        k_cache, v_cache: (Hkv, S, D) one layer of the cache, written in place at slots[t]
        out:      optional (T, Hq, D) buffer for q, qkv's dtype, last dim contiguous
        pdl:      programmatic dependent launch (`swiftspec.kernels.pdl`; Hopper GPUs)
    Returns:
        q: (T, Hq, D) rotated queries in qkv's dtype (`out` when given).
    One launch, grid (T, Hq + Hkv); no host sync.
    """
    d = _check(qkv, cos, sin, slots, k_cache, v_cache, q_heads, kv_heads)
    check_pdl(pdl, qkv.device)
    t = qkv.shape[0]
    q = out if out is not None else torch.empty((t, q_heads, d), dtype=qkv.dtype, device=qkv.device)
    if q.shape != (t, q_heads, d) or q.dtype != qkv.dtype or q.stride(-1) != 1:
        raise ValueError(f"out must be ({t}, {q_heads}, {d}) {qkv.dtype} with a contiguous last dim")
    if t == 0:
        return q
    half = d // 2
    _rope_kv_kernel[(t, q_heads + kv_heads)](
        qkv, cos, sin, slots, q, k_cache, v_cache, q_heads, kv_heads,
        qkv.stride(0), cos.stride(0), sin.stride(0), q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        HALF=half, BLOCK=triton.next_power_of_2(half), PDL=pdl_mode(pdl), num_warps=1 if half <= 64 else 2,
        **launch_options(pdl),
    )
    return q

