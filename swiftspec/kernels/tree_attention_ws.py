"""Warp-specialized tree attention for Hopper (Gluon): the many-row, long-KV shapes.

Same contract as `swiftspec.runtime.attention.tree_attention_ref` and `tree_attention.tree_attention`
(query i sees every prefix slot and its own tree ancestors), for the shapes where the Triton kernel
is compute-bound: 64+ queries of a GQA group over thousands of keys (32/8 heads, kv 16384, 64
queries: 17 GFLOP).

Why a second kernel: per 64-key block the Triton kernel's two dots and its 8192 exponentials run one
after the other, since every warp of the program is in the same phase (Triton's automatic warp
specialization does not take this loop, and it waits on a dot's result right after issuing it).
Here each program has three partitions that only meet at mbarriers:

* a producer (the default partition) streams the split's K and V blocks with TMA into a ring of
  `STAGES` shared-memory slots (`kv_ready[s]`: the copy engine landed both tiles);
* two consumer warpgroups each own 64 of the program's 128 rows, keep their Q in registers (the
  wgmma A operand) and run QK^T -> masked online softmax -> PV on each block, then release the slot
  (`kv_empty[s]`, one arrival per consumer).

The consumers are not in lock-step, so one's softmax runs on the CUDA cores while the other's dots
run on the tensor cores: the overlap FlashAttention-3 gets from warp specialization. They also take
turns on the tensor cores, each turn issuing one block's QK^T with the previous block's PV. A
variant without the turns was no faster and gave wrong results in two tile settings, so only this
schedule is kept. Where it runs and what it gains: docs/decisions.md.

Splits write float32 partials (running max, sum, unnormalised accumulator, same layout as
`tree_attention`'s) and `tree_attention._combine_kernel` merges them (a second launch).

Requirements (`check_ws`): an sm_90 GPU (wgmma), Triton's Gluon, bf16 or fp16, head dim 64 or 128,
group dividing 64, contiguous (Hkv, max_len, D) caches. K/V blocks come through TMA whole,
so a block that runs past a split's last key reads neighbouring cache slots; their scores are masked
to -inf (weight exactly 0), which is exact as long as those slots hold finite numbers. The runtime's
caches start zeroed (`KVCache`), so they do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton

try:  # Gluon is experimental: present in Triton >= 3.4, its names move between releases
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    # Triton 3.6 (the GPU machine) calls the TMA load async_copy_global_to_shared; 3.9 async_load.
    _tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
    # ... and the CTA (partition) barrier thread_barrier; 3.9 barrier.
    _barrier = gl.barrier if hasattr(gl, "barrier") else gl.thread_barrier
    GLUON_ERROR = ""
except Exception as e:  # noqa: BLE001 - any import failure means "not available here"
    GLUON_ERROR = f"{type(e).__name__}: {e}"

from swiftspec.kernels.pdl import launch_options, pdl_mode
from swiftspec.kernels.tree_attention import _combine_kernel, _num_sms, pack_tree_mask, prefix_tensor

ROWS_PER_PROGRAM = 128  # two consumer warpgroups x 64 rows (one m64 wgmma each)
CONSUMER_ROWS = 64


def check_ws_shape(group: int, head_dim: int) -> str:
    """Why `tree_attention_ws` cannot take heads of this shape ("" when it can): group = query heads
    per KV head. `check_ws` applies it; profiles use it to tell which shards take the kernel."""
    if head_dim not in (64, 128):
        return f"head dim {head_dim} is not 64 or 128"
    if CONSUMER_ROWS % group:
        return f"group {group} does not divide {CONSUMER_ROWS}"
    return ""


def check_ws(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> str:
    """Why `tree_attention_ws` cannot run these inputs here ("" when it can)."""
    if GLUON_ERROR:
        return f"Triton's Gluon is not importable ({GLUON_ERROR})"
    if q.device.type != "cuda":
        return f"needs a CUDA GPU, q is on {q.device}"
    if torch.cuda.get_device_capability(q.device) != (9, 0):
        return "needs an sm_90 GPU (Hopper wgmma)"
    if q.dtype not in (torch.bfloat16, torch.float16) or k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        return f"needs bf16 or fp16 q and caches, got {q.dtype}, {k_cache.dtype}"
    if why := check_ws_shape(q.shape[1] // k_cache.shape[0], q.shape[-1]):
        return why
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        return "needs contiguous k_cache and v_cache (TMA)"
    return ""


if not GLUON_ERROR:

    @gluon.jit
    def _ws_producer(KD, VD, k_bufs, v_bufs, kv_ready, kv_empty, row0, n_blocks,
                     BLOCK_N: gl.constexpr, STAGES: gl.constexpr, TILE_BYTES: gl.constexpr):
        """TMA K/V blocks row0 + i * BLOCK_N (i < n_blocks) into slot i % STAGES once both consumers
        have released it (a fresh mbarrier counts its previous phase as complete, so the first
        STAGES waits pass)."""
        for i in range(n_blocks):
            s = i % STAGES
            mbarrier.wait(kv_empty.index(s), ((i // STAGES) & 1) ^ 1)
            mbarrier.expect(kv_ready.index(s), 2 * TILE_BYTES)
            _tma_load(KD, [row0 + i * BLOCK_N, 0], kv_ready.index(s), k_bufs.index(s))
            _tma_load(VD, [row0 + i * BLOCK_N, 0], kv_ready.index(s), v_bufs.index(s))

    @gluon.jit
    def _gdc(INSTR: gl.constexpr):
        """griddepcontrol.wait / .launch_dependents (`swiftspec.kernels.pdl`) as inline PTX."""
        gl.inline_asm_elementwise(INSTR + " // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)

    @gluon.jit
    def _probs(sc, start, m_i, l_i, pl, hi, end_full, N, MASKW, t_of_row, row_ok, offs_n, stride_mt, scale_log2):
        """One key block of the online softmax: scores (64, BLOCK_N) -> probabilities p, the factor
        alpha for the running sum and accumulator, the new running max and sum (log2 units). A block
        at or past end_full touches the prefix end or the tree region: its keys are masked by the
        tree bits (and past hi: the next split's or unused slots)."""
        if start >= end_full:
            cols = start + offs_n
            tidx = cols - pl
            in_tree = (tidx >= 0) & (tidx < N)
            words = gl.load(MASKW + t_of_row[:, None] * stride_mt + (tidx >> 5)[None, :],
                            mask=row_ok[:, None] & in_tree[None, :], other=0)
            bit = (words >> (tidx & 31)[None, :]) & 1
            allowed = (cols < hi)[None, :] & ((cols < pl)[None, :] | (bit != 0))
            sc = gl.where(allowed, sc, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(sc, axis=1) * scale_log2)
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(sc * scale_log2 - m_new[:, None])
        return p, alpha, m_new, l_i * alpha + gl.sum(p, axis=1)

    @gluon.jit
    def _ws_consumer(Q, MASKW, PART_ML, PART_ACC, k_bufs, v_bufs, kv_ready, kv_empty, turn, q_smem,
                     scale_log2, row_base, kvh, split, hkv, rows_total, lo, hi, pl, end_full, n_blocks, N,
                     stride_qt, stride_qh, stride_mt,
                     GROUP: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                     CONSUMER: gl.constexpr, Q_SMEM: gl.constexpr, PDL: gl.constexpr):
        """64 rows (row_base..+63) over the split's blocks; writes this split's partials.

        The two consumers take turns on the tensor cores (`turn[c]`: consumer c may issue, signalled
        by the other after its dots were issued and its scores came back), and each turn issues this
        block's QK^T together with the previous block's PV, so one consumer's softmax runs while the
        other's dots do (FlashAttention-3's schedule). Q_SMEM: QK^T reads Q from shared
        memory (q_smem[CONSUMER]) instead of registers."""
        BLOCK_M: gl.constexpr = 64
        qk_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                            instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, HEAD_DIM, 16])
        q_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=qk_layout, k_width=2)
        p_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        row_qk: gl.constexpr = gl.SliceLayout(1, qk_layout)
        col_qk: gl.constexpr = gl.SliceLayout(0, qk_layout)
        row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
        col_o: gl.constexpr = gl.SliceLayout(0, o_layout)
        ld: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        row_ld: gl.constexpr = gl.SliceLayout(1, ld)
        col_ld: gl.constexpr = gl.SliceLayout(0, ld)
        other: gl.constexpr = 1 - CONSUMER

        # Q stays in registers for the whole walk (the A operand of every QK^T wgmma).
        offs_m = row_base + gl.arange(0, BLOCK_M, layout=row_ld)
        offs_d = gl.arange(0, HEAD_DIM, layout=col_ld)
        q_ptrs = Q + (offs_m // GROUP)[:, None] * stride_qt + (kvh * GROUP + offs_m % GROUP)[:, None] * stride_qh
        q = gl.load(q_ptrs + offs_d[None, :], mask=(offs_m < rows_total)[:, None], other=0.0)
        if Q_SMEM:
            q_smem.index(CONSUMER).store(q)
            fence_async_shared()
            _barrier()
            q = q_smem.index(CONSUMER)
        else:
            q = gl.convert_layout(q, q_op)

        rows = row_base + gl.arange(0, BLOCK_M, layout=row_qk)
        t_of_row = rows // GROUP
        row_ok = rows < rows_total
        offs_n = gl.arange(0, BLOCK_N, layout=col_qk)
        # Finite initial max: a fully masked block then gives p = 0 and alpha = 1 instead of NaN.
        m_i = gl.full([BLOCK_M], -1.0e30, gl.float32, layout=row_qk)
        l_i = gl.zeros([BLOCK_M], gl.float32, layout=row_qk)
        acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=o_layout)
        s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=qk_layout)
        # Turn k of consumer c waits for parity (k & 1) ^ (1 - c): consumer 0's first wait passes on
        # the fresh barrier, every later one waits for the other's k-th signal.
        if n_blocks > 0:
            mbarrier.wait(turn.index(CONSUMER), other)
            mbarrier.wait(kv_ready.index(0), 0)
            sc = warpgroup_mma(q, k_bufs.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            sc = warpgroup_mma_wait(num_outstanding=0, deps=[sc])
            mbarrier.arrive(turn.index(other), count=1)
            p, alpha, m_i, l_i = _probs(sc, lo, m_i, l_i, pl, hi, end_full, N, MASKW, t_of_row, row_ok, offs_n,
                                        stride_mt, scale_log2)
            p16 = gl.convert_layout(p.to(k_bufs.dtype), p_op)
            for i in range(1, n_blocks):
                s = i % STAGES
                sp = (i - 1) % STAGES
                mbarrier.wait(turn.index(CONSUMER), (i & 1) ^ other)
                mbarrier.wait(kv_ready.index(s), (i // STAGES) & 1)
                sc = warpgroup_mma(q, k_bufs.index(s).permute((1, 0)), s_zero, use_acc=False, is_async=True)
                acc = warpgroup_mma(p16, v_bufs.index(sp), acc, is_async=True)
                sc = warpgroup_mma_wait(num_outstanding=1, deps=[sc])  # QK^T back, PV may still run
                mbarrier.arrive(turn.index(other), count=1)
                p, alpha, m_i, l_i = _probs(sc, lo + i * BLOCK_N, m_i, l_i, pl, hi, end_full, N, MASKW, t_of_row,
                                            row_ok, offs_n, stride_mt, scale_log2)
                acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
                mbarrier.arrive(kv_empty.index(sp), count=1)
                # acc holds blocks < i at the old max: rescale after adding PV of block i - 1
                acc = acc * gl.convert_layout(alpha, row_o)[:, None]
                p16 = gl.convert_layout(p.to(k_bufs.dtype), p_op)
            s = (n_blocks - 1) % STAGES
            mbarrier.wait(turn.index(CONSUMER), (n_blocks & 1) ^ other)
            acc = warpgroup_mma(p16, v_bufs.index(s), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
            mbarrier.arrive(turn.index(other), count=1)
            mbarrier.arrive(kv_empty.index(s), count=1)

        if PDL:  # the combine may launch now: it waits for this grid's completion before reading
            _gdc("griddepcontrol.launch_dependents;")
        # Partials, laid out as tree_attention's: PART_ML[(split, kvh, row), 2], PART_ACC[.., D].
        part_row = (split * hkv + kvh) * rows_total + rows
        keep = row_ok & (n_blocks > 0)
        gl.store(PART_ML + part_row * 2, m_i, mask=keep)
        gl.store(PART_ML + part_row * 2 + 1, l_i, mask=keep)
        rows_o = row_base + gl.arange(0, BLOCK_M, layout=row_o)
        part_row_o = (split * hkv + kvh) * rows_total + rows_o
        keep_o = (rows_o < rows_total) & (n_blocks > 0)
        d_o = gl.arange(0, HEAD_DIM, layout=col_o)
        gl.store(PART_ACC + part_row_o[:, None] * HEAD_DIM + d_o[None, :], acc, mask=keep_o[:, None])

    @gluon.jit
    def _ws_attn_kernel(Q, KD, VD, PREFIX, MASKW, PART_ML, PART_ACC,
                        scale_log2, T, N, MAX_LEN, NUM_SPLITS, stride_qt, stride_qh, stride_mt,
                        GROUP: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                        Q_SMEM: gl.constexpr, PDL: gl.constexpr):
        """Program (row tile of 128, kv head, split); partitions in the module docstring. PDL: a
        programmatic dependent launch (wait for the previous kernel before reading anything; let the
        combine launch once the key loops are done)."""
        if PDL:
            _gdc("griddepcontrol.wait;")
        pid_m = gl.program_id(0)
        kvh = gl.program_id(1)
        split = gl.program_id(2)
        hkv = gl.num_programs(1)
        rows_total = T * GROUP
        # The same split arithmetic as tree_attention (and its combine kernel) at this BLOCK_N.
        pl = gl.minimum(gl.load(PREFIX).to(gl.int32), MAX_LEN)
        n_keys = gl.minimum(pl + N, MAX_LEN)
        chunk = gl.maximum(gl.cdiv(gl.cdiv(n_keys, NUM_SPLITS), BLOCK_N) * BLOCK_N, BLOCK_N)
        lo = split * chunk
        hi = gl.minimum(lo + chunk, n_keys)
        end_full = gl.minimum(gl.maximum((pl // BLOCK_N) * BLOCK_N, lo), gl.maximum(hi, lo))
        n_blocks = gl.maximum(gl.cdiv(hi - lo, BLOCK_N), 0)

        dtype: gl.constexpr = KD.dtype
        k_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], KD.layout)
        v_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], VD.layout)
        kv_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        q_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        q_smem = gl.allocate_shared_memory(dtype, [2 if Q_SMEM else 1, 64, HEAD_DIM], q_layout)
        for s in gl.static_range(STAGES):
            mbarrier.init(kv_ready.index(s), count=1)
            mbarrier.init(kv_empty.index(s), count=2)
        for c in gl.static_range(2):
            mbarrier.init(turn.index(c), count=1)
        fence_async_shared()

        tile_bytes: gl.constexpr = BLOCK_N * HEAD_DIM * 2
        row0 = kvh * MAX_LEN + lo
        gl.warp_specialize(
            [(_ws_producer, (KD, VD, k_bufs, v_bufs, kv_ready, kv_empty, row0, n_blocks, BLOCK_N, STAGES, tile_bytes)),
             (_ws_consumer, (Q, MASKW, PART_ML, PART_ACC, k_bufs, v_bufs, kv_ready, kv_empty, turn, q_smem, scale_log2,
                             pid_m * 128, kvh, split, hkv, rows_total, lo, hi, pl, end_full, n_blocks, N,
                             stride_qt, stride_qh, stride_mt, GROUP, HEAD_DIM, BLOCK_N, STAGES, 0, Q_SMEM, PDL)),
             (_ws_consumer, (Q, MASKW, PART_ML, PART_ACC, k_bufs, v_bufs, kv_ready, kv_empty, turn, q_smem, scale_log2,
                             pid_m * 128 + 64, kvh, split, hkv, rows_total, lo, hi, pl, end_full, n_blocks, N,
                             stride_qt, stride_qh, stride_mt, GROUP, HEAD_DIM, BLOCK_N, STAGES, 1, Q_SMEM, PDL))],
            [4, 4], [232, 232],
        )


def default_splits(rows: int, hkv: int, max_len: int, block_n: int, num_sms: int) -> int:
    """Splits so that the programs fill the SMs about once (one program per SM: its K/V ring takes
    most of the shared memory, its 12 warps most of the registers), at most one per key block."""
    tiles = math.ceil(rows / ROWS_PER_PROGRAM) * hkv
    return max(1, min(num_sms // tiles, math.ceil(max_len / block_n)))


@dataclass(frozen=True)
class WsLaunch:
    """Launch tuning of `tree_attention_ws`. block_n: keys per block (64, or 128: no faster, and at
    D 128 only 3 stages with q_smem fit); num_stages: K/V ring slots (shared memory:
    2 * stages * block_n * D * 2 bytes); q_smem: QK^T reads Q from shared memory, not registers;
    num_splits: None -> `default_splits`."""

    num_splits: int | None = None
    block_n: int = 64
    num_stages: int = 4
    q_smem: bool = False

    def __post_init__(self) -> None:
        if self.block_n not in (64, 128) or not 2 <= self.num_stages <= 4:
            raise ValueError(f"block_n must be 64 or 128 and num_stages 2..4, got {self.block_n}, "
                             f"{self.num_stages}")


def tree_attention_ws(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    prefix_len: torch.Tensor | int,
    tree_mask: torch.Tensor,
    scale: float,
    *,
    packed_mask: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    pdl: bool = False,
    launch: WsLaunch | None = None,
) -> torch.Tensor:
    """Tree attention for one layer with the warp-specialized kernel; shapes, arguments and result
    as `tree_attention.tree_attention` (q (T, Hq, D); caches (Hkv, max_len, D); mask (T, N)).

    pdl: both launches are programmatic dependent launches (Hopper; `swiftspec.kernels.pdl`);
    launch: the tile, ring and split tuning (`WsLaunch`; None: the defaults). Launches: pack
    (unless packed_mask), attention, combine. ValueError (`check_ws`'s reason, or a bad tile) where
    it cannot run."""
    launch = launch or WsLaunch()
    block_n, num_stages, q_smem = launch.block_n, launch.num_stages, launch.q_smem
    why = check_ws(q, k_cache, v_cache)
    if why:
        raise ValueError(f"tree_attention_ws: {why}")
    t, hq, d = q.shape
    hkv, max_len, _ = k_cache.shape
    n = tree_mask.shape[1]
    if tree_mask.shape[0] != t or q.stride(-1) != 1:
        raise ValueError(f"tree_mask {tuple(tree_mask.shape)} for {t} queries, q needs a contiguous last dim")
    device = q.device
    group = hq // hkv
    rows = t * group
    prefix = prefix_tensor(prefix_len, device)
    if packed_mask is None:
        packed_mask = pack_tree_mask(tree_mask, pdl=pdl)
    if out is None:
        out = torch.empty_like(q)
    if t == 0:
        return out
    splits = launch.num_splits or default_splits(rows, hkv, max_len, block_n, _num_sms(device))
    part_ml = torch.empty((splits, hkv, rows, 2), dtype=torch.float32, device=device)
    part_acc = torch.empty((splits, hkv, rows, d), dtype=torch.float32, device=device)
    gdt = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16
    layout = gl.NVMMASharedLayout.get_default_for([block_n, d], gdt)
    kd, vd = (TensorDescriptor.from_tensor(c.view(hkv * max_len, d), [block_n, d], layout) for c in (k_cache, v_cache))
    _ws_attn_kernel[(triton.cdiv(rows, ROWS_PER_PROGRAM), hkv, splits)](
        q, kd, vd, prefix, packed_mask, part_ml, part_acc,
        float(scale) * 1.4426950408889634, t, n, max_len, splits, q.stride(0), q.stride(1), packed_mask.stride(0),
        GROUP=group, HEAD_DIM=d, BLOCK_N=block_n, STAGES=num_stages, Q_SMEM=q_smem, PDL=pdl,
        num_warps=4, **launch_options(pdl),
    )
    _combine_kernel[(rows, hkv)](
        prefix, part_ml, part_acc, out, t, n, max_len, splits, out.stride(0), out.stride(1),
        GROUP=group, HEAD_DIM=d, BLOCK_N=block_n, SPLITS_P2=triton.next_power_of_2(splits), PDL=pdl_mode(pdl),
        num_warps=4 if splits * d >= 4096 else 2, **launch_options(pdl),
    )
    return out
