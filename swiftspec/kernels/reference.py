"""Pure-torch references of the fused ops: what the model runs eagerly and what each kernel matches.

`runtime.model` calls `rms_norm`, `apply_rope` and `silu_mul` on its eager path (fusion "off" or
"compile"); the Triton kernels of this package reproduce the composite references
(`add_rmsnorm_ref`, `rope_kv_ref`, `kv_move_ref`, `logsoftmax_topk_ref`) and their tests compare
against them. Numerics follow Hugging Face: RMSNorm statistics in float32, then a cast back to the
model dtype before the weight multiply; RoPE in the rotate-half convention with each multiply and
the add rounded to the model dtype.

This module imports torch only, so both the kernels' tests and the runtime can use it without
importing each other.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as Hugging Face computes it: statistics in float32, cast back, then scale.

    x (..., H), weight (H,) -> (..., H) in the dtype of `weight * x`.
    """
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (T, H, D); cos, sin: (T, D). Rotate-half convention (HF Llama)."""
    half = x.shape[-1] // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos.unsqueeze(1) + rot * sin.unsqueeze(1)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """(T, 2F) fused gate|up projection -> silu(gate) * up, (T, F)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def add_rmsnorm_ref(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference of `kernels.rmsnorm.add_rmsnorm`: the model's eager ops (add, then `rms_norm`).

    x, residual (T, H) (residual None: nothing to add), weight (H,) -> (normed, new_residual), both
    (T, H); new_residual is x itself when residual is None.
    """
    new_res = x if residual is None else residual + x
    return rms_norm(new_res, weight, eps), new_res


def rope_kv_ref(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    slots: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    q_heads: int,
    kv_heads: int,
) -> torch.Tensor:
    """Reference of `kernels.rope_kv.rope_kv`: the model's eager ops (`apply_rope`, then index writes).

    qkv (T, (Hq + 2 Hkv) * D), cos/sin (T, D), slots (T,) int, k_cache/v_cache (Hkv, S, D) written
    in place at `slots`; returns the rotated q (T, Hq, D). Shapes are not validated here (the kernel
    does that).
    """
    d = k_cache.shape[-1]
    t, nq, nkv = qkv.shape[0], q_heads * d, kv_heads * d
    q = apply_rope(qkv[:, :nq].view(t, q_heads, d), cos, sin)
    k = apply_rope(qkv[:, nq : nq + nkv].view(t, kv_heads, d), cos, sin)
    v = qkv[:, nq + nkv :].view(t, kv_heads, d)
    k_cache[:, slots] = k.transpose(0, 1)
    v_cache[:, slots] = v.transpose(0, 1)
    return q


def kv_move_ref(
    k: torch.Tensor,
    v: torch.Tensor,
    src_slots: torch.Tensor,
    dst_start: torch.Tensor | int,
    *,
    n_valid: torch.Tensor | None = None,
) -> None:
    """Reference of `kernels.kv_move.kv_move`: gather every source first, then scatter (may host-sync).

    k, v (layers, Hkv, S, D) modified in place: slots src_slots[i] move to dst_start + i for the
    first n_valid (default all) entries of src_slots.
    """
    n = src_slots.shape[0] if n_valid is None else min(int(n_valid), src_slots.shape[0])
    d0 = int(dst_start)
    idx = src_slots[:n].long()
    for cache in (k, v):
        rows = cache.index_select(2, idx)  # a copy: sources are read before any write
        cache[:, :, d0 : d0 + n].copy_(rows)


def logsoftmax_topk_ref(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference of `kernels.topk.logsoftmax_topk`, what `DraftTree.grow` runs eagerly:
    topk(log_softmax(logits.float()), k) -> values (T, k) float32, indices (T, k) int64."""
    return torch.topk(torch.log_softmax(logits.float(), dim=-1), k, dim=-1)
