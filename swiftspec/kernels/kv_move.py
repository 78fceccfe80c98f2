"""KV compaction in Triton: move cache slots to a contiguous run, all layers, K and V, one launch.

After a verify, the accepted path's KV moves into the prefix and the surviving subtree is packed
right behind it (the "evolving tree cache"): slots `src_slots[i]` go to `dst_start + i`.

Design: one program per (layer, KV head, K-or-V), i.e. layers × Hkv × 2 programs (512 for
Llama-3-8B), each moving n rows of D elements. Programs touch disjoint memory, so the only
possible race is inside a program, where a destination row may be another row's source. A
program therefore gathers rows into registers, waits at a barrier (`tl.debug_barrier`, i.e.
bar.sync: every thread's loads are performed before any thread stores), then scatters:

* n <= 256 (one chunk, the normal case: an accepted path plus a surviving subtree is far smaller):
  correct for ANY src_slots with distinct destinations, overlapping or not, in any order.
* n > 256: rows move in chunks of 256, in order. Correct when the destinations do not overlap the
  sources, or when src_slots is strictly increasing and dst_start + i <= src_slots[i] (every row
  moves to a lower-or-equal slot, which is what compaction does: a later chunk then never reads a
  slot an earlier chunk wrote, and its writes land only on slots earlier chunks already read).
  This precondition is documented, not checked (checking needs a host sync).

`dst_start` and the optional `n_valid` may be device tensors, read in the kernel, so one CUDA graph
serves every step: pad src_slots to a fixed length and pass the live count as n_valid.
Bytes moved: 2 × layers × Hkv × n × D × elem (read + write, K and V): 2 MB for Llama-3-8B, 8 tokens.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from swiftspec.kernels.pdl import check_pdl, grid_sync, launch_options, pdl_mode
from swiftspec.kernels.reference import kv_move_ref  # noqa: F401  (benchmarks import it from here)

_MAX_CHUNK = 256


@triton.jit
def _kv_move_kernel(
    K, V, SRC, DST, NVALID, N, HKV,
    stride_kl, stride_kh, stride_kn, stride_vl, stride_vh, stride_vn,
    HEAD_DIM: tl.constexpr, BLOCK_T: tl.constexpr, HAS_NVALID: tl.constexpr, PDL: tl.constexpr,
):
    """Program (layer·Hkv + head, K or V): move the n slots of one head of one layer."""
    grid_sync(PDL)
    pid = tl.program_id(0)
    which = tl.program_id(1)
    layer = pid // HKV
    head = pid % HKV
    if which == 0:
        base = K + layer * stride_kl + head * stride_kh
        stride_n = stride_kn
    else:
        base = V + layer * stride_vl + head * stride_vh
        stride_n = stride_vn
    dst0 = tl.load(DST).to(tl.int64)
    n = N
    if HAS_NVALID:
        n = tl.minimum(tl.load(NVALID).to(tl.int32), N)
    offs_d = tl.arange(0, HEAD_DIM)
    for start in range(0, N, BLOCK_T):
        i = start + tl.arange(0, BLOCK_T)
        ok = i < n
        src = tl.load(SRC + i, mask=ok, other=0).to(tl.int64)
        rows = tl.load(base + src[:, None] * stride_n + offs_d[None, :], mask=ok[:, None])
        tl.debug_barrier()  # all reads of this chunk are performed before any write
        tl.store(base + (dst0 + i)[:, None] * stride_n + offs_d[None, :], rows, mask=ok[:, None])
        tl.debug_barrier()  # this chunk's writes precede the next chunk's reads


def kv_move(
    k: torch.Tensor,
    v: torch.Tensor,
    src_slots: torch.Tensor,
    dst_start: torch.Tensor | int,
    *,
    n_valid: torch.Tensor | None = None,
    pdl: bool | str = False,
) -> None:
    """Copy slots `src_slots[i]` to `dst_start + i` in every layer and head of k and v, in place.

    Shapes:
        k, v:      (layers, Hkv, max_len, D) caches (same shape), last dim contiguous, D a power of 2
        src_slots: (n,) integer tensor on the caches' device; source slots, destinations distinct
        dst_start: int or 0-d integer tensor on the device (read in the kernel: graph-safe)
        n_valid:   optional 0-d integer tensor: move only the first n_valid entries (graph padding)
        pdl:       programmatic dependent launch (`swiftspec.kernels.pdl`; Hopper GPUs)
    Overlap: any src order is safe for n <= 256; beyond that see the module docstring.
    One launch; no host sync.
    """
    if k.dim() != 4 or v.shape != k.shape:
        raise ValueError(f"k and v must be (layers, Hkv, max_len, D) of one shape, got {tuple(k.shape)}, {tuple(v.shape)}")
    layers, hkv, _max_len, d = k.shape
    if d & (d - 1) or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("head dim must be a power of two with a contiguous last dimension")
    if src_slots.dim() != 1:
        raise ValueError(f"src_slots must be 1-d, got shape {tuple(src_slots.shape)}")
    check_pdl(pdl, k.device)
    n = src_slots.shape[0]
    if n == 0:
        return
    device = k.device
    dst = dst_start.reshape(1) if isinstance(dst_start, torch.Tensor) else torch.full(
        (1,), int(dst_start), dtype=torch.int64, device=device)
    block_t = min(_MAX_CHUNK, max(16, triton.next_power_of_2(n)))
    # 8 warps once a chunk holds over 32 KB, to keep it in registers without spilling.
    num_warps = 8 if block_t * d * k.element_size() > 32 * 1024 else 4
    _kv_move_kernel[(layers * hkv, 2)](
        k, v, src_slots, dst, n_valid if n_valid is not None else dst, n, hkv,
        k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
        HEAD_DIM=d, BLOCK_T=block_t, HAS_NVALID=n_valid is not None, PDL=pdl_mode(pdl), num_warps=num_warps,
        **launch_options(pdl),
    )

