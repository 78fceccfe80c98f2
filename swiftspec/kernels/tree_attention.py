"""Tree attention in Triton: GQA, split-KV (flash-decoding), bit-packed tree mask, graph-safe.

Same contract as `swiftspec.runtime.attention.tree_attention_ref` (read its docstring): query i
attends to every prefix slot [0, prefix_len) and to tree slot prefix_len + j iff tree_mask[i, j].

Design (numbers for an H200: 132 SMs, 4.3 TB/s measured copy bandwidth, 60 MB L2):

* **Rows = queries × group.** One program owns one KV head and a tile of BLOCK_M rows, where row
  r = t * group + g is query t of query head kv_head * group + g. All query heads that share a KV
  head therefore read each K/V tile once (GQA), and a batch-1 decode step (T = 1, group 4–8)
  still gives the tensor-core dot a usable M dimension (padded to 16).
* **Split-KV.** At batch 1 there are only Hkv × ceil(T·group / BLOCK_M) row tiles (8 for a
  Llama-3-8B decode step, 1 for a 70B TP-8 shard) for 132 SMs, so the key range is split over a
  third grid axis of `num_splits` programs. The grid is fixed (CUDA-graph friendly); the split
  size is computed *in the kernel* from the device-resident prefix_len, so the work is spread
  evenly over the splits whatever the prefix is, and splits past the end do nothing. Each split
  writes its partial (running max, sum, unnormalised accumulator) in float32, and the partials are
  merged (log-sum-exp combine) either by a second small kernel, one program per row and KV head
  (combine="separate", default), or in the same launch (combine="kernel": the last split to
  finish merges, see below; its serial merge is slower at most shapes, docs/decisions.md). With
  one split (or one *active* split for this prefix, in-kernel mode) the kernel writes the output
  itself.
  num_splits comes from a time model fitted to the measured H200 sweep (`SplitCostModel`).
* **In-kernel combine.** Per (row tile, KV head) an int32 counter, zero on entry: each active
  split stores its partial and counts itself in, the last to arrive merges (`kernels.counters`
  gives the memory ordering). Inactive splits (no keys for this prefix) do not count: every
  program computes the same n_active from the same device-resident prefix.
  `test_gpu_in_kernel_combine_stress` checks the ordering on a GPU.
* **Mask.** `pack_tree_mask` bit-packs the (T, N) bool mask into (T, ceil(N/32)) int32 words on
  the GPU in one launch (do it once per step and pass `packed_mask=` to every layer). Key blocks
  that lie wholly inside the prefix take a loop with no mask at all; only the blocks that touch
  the tree region (at most ceil(256/BLOCK_N) + 1 of them) read mask bits.
* **Graph safety.** prefix_len is read from device memory inside the kernel (no .item(), no host
  sync); every launch parameter depends only on shapes.
* **Numerics.** Scores, softmax and accumulators in float32; exp2 with log2(e) folded into the
  scale; float32 inputs use IEEE (not TF32) dots. A row that sees no key at all (prefix_len 0 and
  an all-False mask row) gives NaN, exactly as the reference's softmax over all -inf does.

Tile sizes (`choose_config`): BLOCK_N = 64 keys for D = 64 and 128 (K and V tiles 16 KB each in
bf16 at D 128), 32 for float32 inputs (a correctness path: IEEE dots spill registers even so);
BLOCK_M = 16..64 rows by the row count below 64 rows, 128 from 64 rows on at D 128 (the tile
sweeps of `bench_kernels.py --tile-sweep`); num_warps 4 (8 at BLOCK_M 128: two 64-row wgmma
warpgroups; 8 also at BLOCK_M 64 outside the swept tiles), num_stages 2 (3 when a split walks >= 8
key blocks). Heuristic, not autotuned: autotuning inside CUDA-graph
capture is slow and picks per-shape configs the graph cannot change.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from swiftspec.kernels import interpreting
from swiftspec.kernels.counters import CounterWorkspace, arrival_counters
from swiftspec.kernels.pdl import check_pdl, grid_release, grid_sync, launch_options, pdl_mode

try:  # host-side TMA descriptors: newer Triton releases only (the TMA loads need them)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:
    TensorDescriptor = None

# H200 streaming multiprocessors; used when no GPU is present (interpreter) so CPU tests exercise
# the same split heuristic the GPU would use.
_DEFAULT_NUM_SMS = 132
# BLOCK_M 16 above 32 rows while its K/V reads (one per 16-row tile) stay below this: between the
# sizes where it won and lost (`choose_config`, docs/decisions.md)
NARROW_TILE_MAX_BYTES = 24 << 20
# 16-row tiles read the prefix K/V through TMA descriptors from this many bytes of such reads on
# (`choose_config`, docs/decisions.md)
TMA_MIN_BYTES = 32 << 20


@triton.jit
def _pack_mask_kernel(
    MASK, PACKED, N, W, stride_mt, stride_pt,
    BLOCK_W: tl.constexpr, PDL: tl.constexpr,
):
    """Program (t, w-block): pack BLOCK_W words of 32 mask bits of row t."""
    grid_sync(PDL)
    t = tl.program_id(0)
    wb = tl.program_id(1)
    words = wb * BLOCK_W + tl.arange(0, BLOCK_W)
    bit = tl.arange(0, 32)
    col = words[:, None] * 32 + bit[None, :]
    m = tl.load(MASK + t * stride_mt + col, mask=col < N, other=0).to(tl.int32)
    # Distinct bits: the int32 sum equals their bitwise OR (bit 31 wraps to the sign bit).
    packed = tl.sum(m << bit[None, :], axis=1)
    tl.store(PACKED + t * stride_pt + words, packed, mask=words < W)


def pack_tree_mask(tree_mask: torch.Tensor, *, pdl: bool | str = False) -> torch.Tensor:
    """Bit-pack a (T, N) bool tree mask into (T, max(1, ceil(N / 32))) int32 words, on its device.

    Bit j % 32 of word j // 32 in row i is tree_mask[i, j]. One launch, no host sync; reuse the
    result for every layer of a step (`tree_attention(..., packed_mask=...)`). pdl: programmatic
    dependent launch (`swiftspec.kernels.pdl`; Hopper GPUs).
    """
    if tree_mask.dim() != 2 or tree_mask.dtype != torch.bool:
        raise ValueError(f"tree_mask must be a 2-d bool tensor, got {tuple(tree_mask.shape)} {tree_mask.dtype}")
    check_pdl(pdl, tree_mask.device)
    t, n = tree_mask.shape
    w = max(1, triton.cdiv(n, 32))
    packed = torch.empty((t, w), dtype=torch.int32, device=tree_mask.device)
    if t == 0:
        return packed
    m = tree_mask.contiguous().view(torch.uint8)
    block_w = min(32, triton.next_power_of_2(w))
    _pack_mask_kernel[(t, triton.cdiv(w, block_w))](m, packed, n, w, m.stride(0), packed.stride(0), BLOCK_W=block_w,
                                                           PDL=pdl_mode(pdl), **launch_options(pdl))
    return packed


def ancestor_mask(parents: torch.Tensor) -> torch.Tensor:
    """Square tree mask from a parent-index array, built on the array's device (no host loop per node).

    parents: (N,) integer, parents[0] = -1 (root), parents[i] < i. Returns (N, N) bool with
    mask[i, j] = True iff node j is node i or one of its ancestors. ceil(log2 N) boolean matrix
    squarings of (I | parent edges): their count depends only on N, so this is graph-capturable.
    """
    n = parents.shape[0]
    eye = torch.eye(n, dtype=torch.float32, device=parents.device)
    if n == 0:
        return eye.bool()
    has_parent = parents >= 0
    edge = torch.zeros((n, n), dtype=torch.float32, device=parents.device)
    edge[torch.arange(n, device=parents.device), parents.clamp(min=0).long()] = has_parent.float()
    reach = eye + edge  # paths of length <= 1
    for _ in range(max(0, math.ceil(math.log2(n)))):
        reach = (reach @ reach).clamp(max=1.0)  # paths of length <= 2**k
    return reach > 0


def pack_tree_mask_ref(tree_mask: torch.Tensor) -> torch.Tensor:
    """Pure-torch reference of `pack_tree_mask` (several launches; for tests)."""
    t, n = tree_mask.shape
    w = max(1, math.ceil(n / 32))
    padded = torch.zeros((t, w * 32), dtype=torch.int64, device=tree_mask.device)
    padded[:, :n] = tree_mask.to(torch.int64)
    shifts = torch.arange(32, device=tree_mask.device, dtype=torch.int64)
    words = (padded.view(t, w, 32) << shifts).sum(-1)  # < 2**32, fits int64
    words = torch.where(words >= 2**31, words - 2**32, words)  # reinterpret as two's complement
    return words.to(torch.int32)


@triton.jit
def _tree_attn_kernel(
    Q, K, V, KD, VD, PREFIX, MASKW, OUT, PART_ML, PART_ACC, COUNTERS,
    scale_log2, T, N, MAX_LEN, NUM_SPLITS,
    stride_qt, stride_qh, stride_kh, stride_kn, stride_vh, stride_vn,
    stride_mt, stride_ot, stride_oh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr, IEEE: tl.constexpr, DOT_F32: tl.constexpr,
    IN_KERNEL_COMBINE: tl.constexpr, SPLITS_P2: tl.constexpr, PDL: tl.constexpr, TMA: tl.constexpr,
):
    """Program (row tile, kv head, split): attention of BLOCK_M rows over one split of the keys.

    TMA: the prefix blocks' K and V come through tensor descriptors KD / VD over the (Hkv * MAX_LEN,
    D) caches (block (BLOCK_N, D)): the copy engine computes the addresses, not the warps.

    IN_KERNEL_COMBINE (with SPLIT): the last split to finish for its (row tile, kv head) merges all
    splits' partials and writes the output; COUNTERS[pid_m * Hkv + kvh] (int32, zero on entry)
    counts arrivals and is reset to zero by that last split. Memory-ordering argument in
    `tree_attention`'s module docstring ("In-kernel combine").
    """
    grid_sync(PDL)
    pid_m = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    hkv = tl.num_programs(1)
    rows_total = T * GROUP

    pl = tl.minimum(tl.load(PREFIX).to(tl.int32), MAX_LEN)  # clamp: never read past the cache
    n_keys = tl.minimum(pl + N, MAX_LEN)  # slots past prefix + N are masked in the reference
    # Split size from the live key count: even work per split for any prefix_len (grid is fixed).
    chunk = tl.cdiv(tl.cdiv(n_keys, NUM_SPLITS), BLOCK_N) * BLOCK_N
    chunk = tl.maximum(chunk, BLOCK_N)
    lo = split * chunk
    hi = tl.minimum(lo + chunk, n_keys)
    # Blocks [lo, end_full) lie wholly inside the prefix: no mask needed there.
    end_full = tl.minimum(tl.maximum((pl // BLOCK_N) * BLOCK_N, lo), tl.maximum(hi, lo))

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = offs_m < rows_total
    t_of_row = offs_m // GROUP
    head_of_row = kvh * GROUP + offs_m % GROUP
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)

    q = tl.load(
        Q + t_of_row[:, None] * stride_qt + head_of_row[:, None] * stride_qh + offs_d[None, :],
        mask=row_ok[:, None], other=0.0,
    )
    if DOT_F32:
        q = q.to(tl.float32)
    k_base = K + kvh * stride_kh + offs_d[:, None]  # K read transposed: (D, BLOCK_N)
    v_base = V + kvh * stride_vh + offs_d[None, :]

    # Finite initial max: a fully masked block then gives p = 0 and alpha = 1 instead of NaN.
    m_i = tl.full((BLOCK_M,), -1.0e30, dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)

    # Prefix blocks: every row sees every key.
    for start in range(lo, end_full, BLOCK_N):
        cols = start + offs_n
        if TMA:
            k = tl.trans(KD.load([kvh * MAX_LEN + start, 0]))
        else:
            k = tl.load(k_base + cols[None, :] * stride_kn)
        if DOT_F32:
            k = k.to(tl.float32)
        p, alpha, m_i, l_i = _online_softmax(_dot(q, k, IEEE), m_i, l_i, scale_log2)
        if TMA:
            v = VD.load([kvh * MAX_LEN + start, 0])
        else:
            v = tl.load(v_base + cols[:, None] * stride_vn)
        if DOT_F32:
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, IEEE)

    # Blocks touching the prefix end or the tree region: prefix keys unconditionally, tree keys by bit.
    for start in range(end_full, hi, BLOCK_N):
        cols = start + offs_n
        col_ok = cols < hi
        tidx = cols - pl
        in_tree = (tidx >= 0) & (tidx < N)
        words = tl.load(
            MASKW + t_of_row[:, None] * stride_mt + (tidx >> 5)[None, :],
            mask=row_ok[:, None] & in_tree[None, :], other=0,
        )
        bit = (words >> (tidx & 31)[None, :]) & 1
        allowed = col_ok[None, :] & ((cols < pl)[None, :] | (bit != 0))
        k = tl.load(k_base + cols[None, :] * stride_kn, mask=col_ok[None, :], other=0.0)
        if DOT_F32:
            k = k.to(tl.float32)
        s = tl.where(allowed, _dot(q, k, IEEE), float("-inf"))
        p, alpha, m_i, l_i = _online_softmax(s, m_i, l_i, scale_log2)
        v = tl.load(v_base + cols[:, None] * stride_vn, mask=col_ok[:, None], other=0.0)
        if DOT_F32:
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, IEEE)

    grid_release(PDL)  # late PDL: the next kernel may launch during the stores / the merge
    if not SPLIT:
        _store_out(OUT, acc, l_i, t_of_row, head_of_row, offs_d, row_ok, stride_ot, stride_oh)
    elif not IN_KERNEL_COMBINE:
        # The combine kernel never reads inactive splits (lo >= hi): skip their stores.
        keep = row_ok & (offs_m * 0 + lo < hi)
        part_row = (split * hkv + kvh) * rows_total + offs_m
        tl.store(PART_ML + part_row * 2, m_i, mask=keep)
        tl.store(PART_ML + part_row * 2 + 1, l_i, mask=keep)
        tl.store(PART_ACC + part_row[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=keep[:, None])
    else:
        # Splits [0, n_active) have keys (lo < hi); n_active >= 1 so that with no key at all
        # (n_keys = 0) split 0 still writes the NaN rows of the contract.
        n_active = tl.maximum(tl.cdiv(n_keys, chunk), 1)
        if n_active == 1:
            if split == 0:  # the only split saw every key: write the output, no scratch, no counter
                _store_out(OUT, acc, l_i, t_of_row, head_of_row, offs_d, row_ok, stride_ot, stride_oh)
        else:
            if split < n_active:
                part_row = (split * hkv + kvh) * rows_total + offs_m
                tl.store(PART_ML + part_row * 2, m_i, mask=row_ok)
                tl.store(PART_ML + part_row * 2 + 1, l_i, mask=row_ok)
                tl.store(PART_ACC + part_row[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=row_ok[:, None])
                # bar.sync: every thread's partial stores are performed (CTA scope) before the one
                # thread that runs the scalar atomic releases them at GPU scope.
                tl.debug_barrier()
                cnt = COUNTERS + pid_m * hkv + kvh
                # acq_rel at gpu scope: releases this split's partials; for the last arrival,
                # acquires every earlier split's (each released before its own increment).
                arrived = tl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")
                if arrived == n_active - 1:
                    _merge_splits(
                        PART_ML, PART_ACC, OUT, n_active, kvh, hkv, rows_total, offs_m, row_ok,
                        t_of_row, head_of_row, offs_d, stride_ot, stride_oh,
                        HEAD_DIM=HEAD_DIM, BLOCK_M=BLOCK_M, SPLITS_P2=SPLITS_P2,
                    )
                    # Every active split has arrived: nobody touches the counter again in this
                    # launch, so zero it for the next call / graph replay.
                    tl.atomic_xchg(cnt, 0, sem="relaxed", scope="gpu")


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    """a @ b with float32 accumulation; IEEE: exact float32 products (not TF32)."""
    if IEEE:
        r = tl.dot(a, b, input_precision="ieee")
    else:
        r = tl.dot(a, b)
    return r


@triton.jit
def _online_softmax(s, m_i, l_i, scale_log2):
    """One key block of the online softmax: raw scores s (BLOCK_M, BLOCK_N) -> unnormalised
    probabilities p, the factor alpha that rescales the running sum and accumulator, the new
    running max and sum (log2 units). The scale is folded into the max (exact: scale > 0) and
    into one FMA with the subtraction."""
    m_new = tl.maximum(m_i, tl.max(s, 1) * scale_log2)
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s * scale_log2 - m_new[:, None])
    return p, alpha, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit
def _store_out(OUT, acc, l_i, t_of_row, head_of_row, offs_d, row_ok, stride_ot, stride_oh):
    """out = acc / l for the real rows. 0/0 = NaN for a real row with no key, as in the reference;
    padding rows divide by 1 and are not stored."""
    out = acc / tl.where(row_ok, l_i, 1.0)[:, None]
    tl.store(
        OUT + t_of_row[:, None] * stride_ot + head_of_row[:, None] * stride_oh + offs_d[None, :],
        out.to(OUT.dtype.element_ty), mask=row_ok[:, None],
    )


@triton.jit
def _merge_splits(
    PART_ML, PART_ACC, OUT, n_active, kvh, hkv, rows_total, offs_m, row_ok,
    t_of_row, head_of_row, offs_d, stride_ot, stride_oh,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, SPLITS_P2: tl.constexpr,
):
    """Log-sum-exp merge of the partials of splits [0, n_active) of one (row tile, kv head).

    Two passes so that the big loads do not wait on each other: (1) every split's (m, l) in one
    (SPLITS_P2, BLOCK_M) load gives the global max and the total weight; (2) the accumulators,
    two splits per iteration, each weighted by exp2(m_s - max). Partials are read with .cg (L2,
    not the SM's L1): they were written by other SMs during this launch.
    """
    s_idx = tl.arange(0, SPLITS_P2)
    ml_row = (s_idx[:, None] * hkv + kvh) * rows_total + offs_m[None, :]
    ok = (s_idx < n_active)[:, None] & row_ok[None, :]
    m_all = tl.load(PART_ML + ml_row * 2, mask=ok, other=-1.0e30, cache_modifier=".cg")
    l_all = tl.load(PART_ML + ml_row * 2 + 1, mask=ok, other=0.0, cache_modifier=".cg")
    m_max = tl.max(m_all, 0)
    l_tot = tl.sum(l_all * tl.exp2(m_all - m_max[None, :]), 0)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)
    step = hkv * rows_total  # rows between split s and split s + 1
    for s in range(0, n_active, 2):
        r0 = (s * hkv + kvh) * rows_total + offs_m
        r1 = r0 + step
        ok1 = row_ok & (offs_m * 0 + s + 1 < n_active)  # vector form: the interpreter rejects a scalar mask
        a0 = tl.load(PART_ACC + r0[:, None] * HEAD_DIM + offs_d[None, :], mask=row_ok[:, None], other=0.0,
                     cache_modifier=".cg")
        a1 = tl.load(PART_ACC + r1[:, None] * HEAD_DIM + offs_d[None, :], mask=ok1[:, None], other=0.0,
                     cache_modifier=".cg")
        m0 = tl.load(PART_ML + r0 * 2, mask=row_ok, other=-1.0e30, cache_modifier=".cg")
        m1 = tl.load(PART_ML + r1 * 2, mask=ok1, other=-1.0e30, cache_modifier=".cg")
        acc += a0 * tl.exp2(m0 - m_max)[:, None] + a1 * tl.exp2(m1 - m_max)[:, None]
    _store_out(OUT, acc, l_tot, t_of_row, head_of_row, offs_d, row_ok, stride_ot, stride_oh)


@triton.jit
def _combine_kernel(
    PREFIX, PART_ML, PART_ACC, OUT, T, N, MAX_LEN, NUM_SPLITS, stride_ot, stride_oh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS_P2: tl.constexpr,
    PDL: tl.constexpr,
):
    """Program (row, kv head): log-sum-exp merge of one row's active splits.

    One row per program, every split's (m, l) and accumulator in one load each, so the merge is a
    single round trip to L2 however many splits there are (T · group · Hkv programs: 64 for 8
    queries of a 70B TP-8 shard, 2048 for 64 queries of Llama-3-8B)."""
    grid_sync(PDL)
    r = tl.program_id(0)
    kvh = tl.program_id(1)
    hkv = tl.num_programs(1)
    rows_total = T * GROUP
    pl = tl.minimum(tl.load(PREFIX).to(tl.int32), MAX_LEN)
    n_keys = tl.minimum(pl + N, MAX_LEN)
    chunk = tl.maximum(tl.cdiv(tl.cdiv(n_keys, NUM_SPLITS), BLOCK_N) * BLOCK_N, BLOCK_N)
    n_active = tl.cdiv(n_keys, chunk)  # same split arithmetic as the attention kernel

    s = tl.arange(0, SPLITS_P2)
    ok = s < n_active
    part_row = (s * hkv + kvh) * rows_total + r
    offs_d = tl.arange(0, HEAD_DIM)
    m = tl.load(PART_ML + part_row * 2, mask=ok, other=-1.0e30)
    lsum = tl.load(PART_ML + part_row * 2 + 1, mask=ok, other=0.0)
    acc = tl.load(PART_ACC + part_row[:, None] * HEAD_DIM + offs_d[None, :], mask=ok[:, None], other=0.0)
    # Inactive splits weigh exp2(-1e30 - max) = 0; a row with no key anywhere gives 0 / 0 = NaN,
    # as the reference does.
    w = tl.exp2(m - tl.max(m, 0))
    out = tl.sum(acc * w[:, None], 0) / tl.sum(lsum * w, 0)
    t = r // GROUP
    head = kvh * GROUP + r % GROUP
    tl.store(OUT + t * stride_ot + head * stride_oh + offs_d, out.to(OUT.dtype.element_ty))


@dataclass(frozen=True)
class TreeAttentionConfig:
    """Launch shape of one tree-attention call (all derived from tensor shapes, never from data).

    block_m: rows (query × group) per program; block_n: keys per iteration; num_splits: programs
    along the key axis (1 = no partials, no combine); tma: the prefix blocks' K/V come through TMA
    tensor descriptors (contiguous caches only).
    """

    block_m: int
    block_n: int
    num_splits: int
    num_warps: int = 4
    num_stages: int = 2
    tma: bool = False


_SPLIT_CANDIDATES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


@dataclass(frozen=True)
class SplitCostModel:
    """Time (µs) of one split-KV tree-attention call as a function of num_splits; `choose_config`
    picks the candidate with the smallest modelled time. With S splits, B = ceil(max_len / BLOCK_N)
    key blocks, c = max(1, ceil(ceil(max_len / S) / BLOCK_N)) blocks per split, n = ceil(B / c)
    active splits, P = tiles × n programs, and m = n (`merge_over="active"`) or next_pow2(S)
    (`merge_over="launched"`):

        t = fixed + (block · c + [S > 1] · split_program) · max(1, P / (SMs · ctas_per_sm))
              + [S > 1] · (combine + merge_per_split · m + m · rows · Hkv · D · 8 bytes / partial_bw)

    * block_us: one program's time per key block (latency-bound: ~1.3–1.7 µs at BLOCK_M 64 / 8
      warps, 0.9–1.1 µs at BLOCK_M <= 32 / 4 warps); scaled by BLOCK_N · D / (64 · 128) for other
      tiles (an extrapolation: only D 128, BLOCK_N 64 was measured).
    * ctas_per_sm: ~1 resident program per SM, so programs beyond the SM count run in waves.
    * split_program_us: extra per-wave cost of a split launch (partial store).
    * combine_us, merge_per_split_us, partial_bw: the merge. The in-kernel combine (`KERNEL_COST`)
      loops over the active splits serially in 1–2 programs per kv head (0.63 µs per split); the
      separate, row-parallel combine kernel (`SEPARATE_COST`) loads every launched split's
      partial row at once (m = next_pow2(S) register tiles: what makes 64 splits slow at 128
      queries, where those tiles reach 32 KB per program).

    * ctas_per_sm_m16 (0: ctas_per_sm_narrow): resident programs per SM at BLOCK_M 16, whose small
      tiles fit several per SM; hbm_bytes_per_us (0: none): a floor, t >= fixed + the K/V bytes
      (bf16) / bandwidth, which the wave term alone stops giving once more programs fit an SM.

    Defaults (`KERNEL_COST`): fitted (least squares on relative error, rms 5.7 %) to the H200 grid
    sweep of the in-kernel combine (bf16, D 128, BLOCK_N 64; docs/decisions.md).
    """

    fixed_us: float = 5.83
    block_us_wide: float = 1.744
    block_us_narrow: float = 1.115
    ctas_per_sm_wide: float = 0.908
    ctas_per_sm_narrow: float = 1.095
    split_program_us: float = 4.07
    merge_per_split_us: float = 0.63
    partial_bytes_per_us: float = 7.06e6
    combine_us: float = 0.0
    merge_over: str = "active"
    ctas_per_sm_m16: float = 0.0
    hbm_bytes_per_us: float = 0.0

    def time_us(self, num_splits: int, rows: int, hkv: int, d: int, max_len: int, block_m: int, block_n: int,
                num_sms: int = _DEFAULT_NUM_SMS) -> float:
        """Modelled µs of one call: rows = T × group query rows per KV head, max_len keys."""
        wide = block_m >= 64
        tiles = triton.cdiv(rows, block_m) * hkv
        blocks = max(1, triton.cdiv(max_len, block_n))
        per_split = max(1, triton.cdiv(triton.cdiv(max_len, num_splits), block_n))
        active = triton.cdiv(blocks, per_split)
        block_us = (self.block_us_wide if wide else self.block_us_narrow) * block_n * d / (64 * 128)
        occupancy = self.ctas_per_sm_wide if wide else self.ctas_per_sm_narrow
        if block_m == 16 and self.ctas_per_sm_m16:
            occupancy = self.ctas_per_sm_m16
        waves = max(1.0, tiles * active / (num_sms * occupancy))
        split = num_splits > 1
        t = self.fixed_us + (block_us * per_split + split * self.split_program_us) * waves
        if split:
            merged = active if self.merge_over == "active" else triton.next_power_of_2(num_splits)
            t += self.combine_us + self.merge_per_split_us * merged
            t += merged * rows * hkv * d * 8 / self.partial_bytes_per_us
        if self.hbm_bytes_per_us:
            t = max(t, self.fixed_us + max_len * hkv * d * 4 / self.hbm_bytes_per_us)
        return t

    def best_splits(self, rows: int, hkv: int, d: int, max_len: int, block_m: int, block_n: int,
                    num_sms: int = _DEFAULT_NUM_SMS, candidates: tuple[int, ...] = _SPLIT_CANDIDATES) -> int:
        """The candidate num_splits with the smallest modelled time (ties: fewer splits)."""
        return _best_splits(self, rows, hkv, d, max_len, block_m, block_n, num_sms, tuple(candidates))


@functools.lru_cache(maxsize=4096)
def _best_splits(model: SplitCostModel, rows: int, hkv: int, d: int, max_len: int, block_m: int, block_n: int,
                 num_sms: int, candidates: tuple[int, ...]) -> int:
    # Memoised: called per layer per step in eager mode; a pure function of shapes.
    return min(candidates, key=lambda s: (model.time_us(s, rows, hkv, d, max_len, block_m, block_n, num_sms), s))


KERNEL_COST = SplitCostModel()
# Fitted by benchmarks/fit_split_model.py to the num_splits sweep with combine "separate" (30 shapes
# x S in 1..64; rms 13 %, the pick within 1.8 % of the sweep's best on average; docs/decisions.md).
SEPARATE_COST = SplitCostModel(
    fixed_us=6.163, block_us_wide=1.295, block_us_narrow=0.916, ctas_per_sm_wide=0.877, ctas_per_sm_narrow=1.029,
    split_program_us=1.659, merge_per_split_us=0.0, partial_bytes_per_us=1.985e6, combine_us=0.393,
    merge_over="launched",
    # BLOCK_M 16 programs fit several per SM: with the fitted 1.03 per SM the model under-splits
    # them; 3 per SM and the HBM floor (the H200's copy bandwidth) fix that (docs/decisions.md).
    ctas_per_sm_m16=3.0, hbm_bytes_per_us=4.2e6,
)
SPLIT_COST = {"kernel": KERNEL_COST, "separate": SEPARATE_COST}
COMBINE_MODES = ("separate", "kernel")


def prefix_tensor(prefix_len: torch.Tensor | int, device: torch.device) -> torch.Tensor:
    """prefix_len as the (1,) device tensor the kernels read: a view of a tensor (the kernel reads
    the live value at graph replay time), or a new int32 tensor for an int."""
    if isinstance(prefix_len, torch.Tensor):
        return prefix_len.reshape(1)
    return torch.full((1,), int(prefix_len), dtype=torch.int32, device=device)


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return _DEFAULT_NUM_SMS


@dataclass(frozen=True)
class TreeAttentionLaunch:
    """How `tree_attention` launches (the defaults: `choose_config`'s rules, the separate combine).

    combine: how split-KV partials are merged when num_splits > 1: "separate" (a second,
    row-parallel combine launch) or "kernel" (the last split to finish merges, one launch).
    workspace: counters for combine "kernel", shared by all calls of a stream
    (`kernels.counters.CounterWorkspace`); without one each split call zeroes fresh counters (one memset).
    num_splits, block_m, block_n, num_warps, num_stages: override the launch shape (benchmarks,
    tests). tma: read the prefix blocks' K/V through TMA tensor descriptors (Hopper; contiguous
    caches); None: `choose_config`'s rule, which falls back to plain loads for non-contiguous caches.
    """

    combine: str = "separate"
    workspace: CounterWorkspace | None = None
    num_splits: int | None = None
    block_m: int | None = None
    block_n: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    tma: bool | None = None

    def __post_init__(self) -> None:
        if self.combine not in COMBINE_MODES:
            raise ValueError(f"combine must be one of {COMBINE_MODES}, got {self.combine!r}")


def choose_config(
    t: int, hq: int, hkv: int, d: int, max_len: int, elem_bytes: int, num_sms: int = _DEFAULT_NUM_SMS,
    launch: TreeAttentionLaunch | None = None, *, cost: SplitCostModel | None = None,
) -> TreeAttentionConfig:
    """Launch shape for tree attention (no autotuning: graph capture wants a fixed shape).

    BLOCK_M (bf16/fp16, D 64 and 128): 16 up to 32 rows (rows = T × group), and above while the
    K/V reads of 16-row tiles stay <= `NARROW_TILE_MAX_BYTES` (D 128); otherwise 64, or 128 from
    64 rows on at D 128. BLOCK_N: 64 (bf16/fp16), 32 (float32). BLOCK_M 16 and 64 run 4 warps, 128
    runs 8. float32 and other head dims take BLOCK_M 16..64 (next power of two), 8 warps at 64.
    tma: 16-row tiles at D 128 read the prefix K/V through TMA descriptors once their K/V reads
    reach `TMA_MIN_BYTES`.
    num_splits minimises `SplitCostModel.time_us` over 1..64 with the model fitted to the measured
    H200 sweep of the combine mode (`SPLIT_COST[launch.combine]`, or `cost` when given).
    `launch`'s launch-shape fields override these rules.
    """
    lc = launch or TreeAttentionLaunch()
    rows = t * (hq // hkv)
    bm = lc.block_m or min(64, max(16, triton.next_power_of_2(rows)))
    # float32 is the correctness path (IEEE dots run on FMA units and spill at wider key tiles);
    # D 64 takes BLOCK_N 64 with 4 warps, faster there than 128 with 8 (docs/decisions.md)
    bn = lc.block_n or (32 if elem_bytes >= 4 else 64 if d >= 128 or d == 64 else 128)
    # the tile rules below were measured for BLOCK_N 64 at D 64 and 128 only (bf16/fp16)
    swept = elem_bytes <= 2 and bn == 64 and d in (64, 128)
    if lc.block_m is None and swept and rows > 16:
        # BLOCK_M 16 while its extra K/V reads (one per 16-row tile, mostly from L2) stay small:
        # shorter programs, and 8x more of them to fill the SMs (docs/decisions.md)
        narrow_bytes = triton.cdiv(rows, 16) * hkv * max_len * d * 2 * elem_bytes
        if rows <= 32 or (d == 128 and narrow_bytes <= NARROW_TILE_MAX_BYTES):
            bm = 16
        elif d == 128 and rows >= 64:
            # BLOCK_M 128 (two 64-row wgmma warpgroups) costs per key block about what a 64-row tile
            # does, so fewer row tiles leave each split more keys; slower at D 64 (docs/decisions.md)
            bm = 128
    num_splits = lc.num_splits
    if num_splits is None:
        num_splits = (cost or SPLIT_COST[lc.combine]).best_splits(rows, hkv, d, max_len, bm, bn, num_sms)
    # BLOCK_M <= 32: 4 warps (mma.sync); 128: 8 (two wgmma groups); 64: 4 on the swept tiles, where
    # 4 neither spill nor lose, else 8 (docs/decisions.md)
    num_warps = lc.num_warps or (8 if bm >= 128 or (bm == 64 and not swept) else 4)
    num_stages = lc.num_stages
    if num_stages is None:
        # a third pipeline stage pays once a program walks >= 8 key blocks and costs at short ones,
        # unless 16-row programs fill the SMs several deep, where its shared memory costs residency
        # (docs/decisions.md)
        keys_per_split = triton.cdiv(max_len, int(num_splits))
        num_stages = 3 if elem_bytes <= 2 and keys_per_split >= 8 * bn else 2
        programs = triton.cdiv(rows, bm) * hkv * int(num_splits)
        if bm == 16 and swept and programs > 2 * num_sms:
            num_stages = 2
    tma = lc.tma
    if tma is None:
        # TMA takes the address arithmetic off the 4 warps of a 16-row program: it pays where many
        # such programs stream a long prefix (docs/decisions.md)
        reads = triton.cdiv(rows, 16) * hkv * max_len * d * 2 * elem_bytes
        tma = swept and bm == 16 and d == 128 and reads >= TMA_MIN_BYTES
    return TreeAttentionConfig(block_m=bm, block_n=bn, num_splits=int(num_splits), num_warps=num_warps,
                               num_stages=num_stages, tma=bool(tma))


def tree_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    prefix_len: torch.Tensor | int,
    tree_mask: torch.Tensor,
    scale: float,
    *,
    packed_mask: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    pdl: bool | str = False,
    launch: TreeAttentionLaunch | None = None,
) -> torch.Tensor:
    """Tree attention for one layer (GQA, split-KV); drop-in for `tree_attention_ref`.

    Shapes:
        q:           (T, Hq, D)        queries, last dim contiguous; T 1..256, D a power of two >= 16
        k_cache:     (Hkv, max_len, D) keys of this layer, last dim contiguous; Hq % Hkv == 0
        v_cache:     (Hkv, max_len, D)
        prefix_len:  int or 0-d integer tensor on q's device (read in the kernel: graph-safe)
        tree_mask:   (T, N) bool, N <= max_len - prefix_len
        packed_mask: optional (T, ceil(N/32)) int32 from `pack_tree_mask(tree_mask)`; pass it to
                     skip the packing launch (pack once per step, use for every layer)
        out:         optional (T, Hq, D) output buffer, dtype of q, last dim contiguous (static
                     buffers for CUDA graphs)
        pdl:         programmatic dependent launch of every launch (`swiftspec.kernels.pdl`; Hopper)
        launch:      the split merge and launch-shape overrides (`TreeAttentionLaunch`; None: the
                     defaults)
    Returns:
        (T, Hq, D), dtype of q (`out` when given); float32 softmax and accumulation.
    Launches: pack (unless packed_mask), attention, and with num_splits > 1 either the combine
    kernel (combine "separate") or, with no workspace, a counter memset.
    """
    launch = launch or TreeAttentionLaunch()
    combine, workspace = launch.combine, launch.workspace
    t, hq, d = q.shape
    hkv, max_len, dk = k_cache.shape
    n = tree_mask.shape[1]
    if dk != d or v_cache.shape != k_cache.shape or hq % hkv != 0:
        raise ValueError(f"shape mismatch: q {tuple(q.shape)}, k {tuple(k_cache.shape)}, v {tuple(v_cache.shape)}")
    if d < 16 or d & (d - 1):
        raise ValueError(f"head dim {d} must be a power of two >= 16")
    if tree_mask.shape[0] != t:
        raise ValueError(f"tree_mask has {tree_mask.shape[0]} rows for {t} queries")
    if q.stride(-1) != 1 or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("q, k_cache and v_cache need a contiguous last dimension")
    device = q.device
    check_pdl(pdl, device)
    prefix = prefix_tensor(prefix_len, device)
    if packed_mask is None:
        packed_mask = pack_tree_mask(tree_mask, pdl=pdl)
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype != q.dtype or out.stride(-1) != 1:
        raise ValueError(f"out must be {tuple(q.shape)} {q.dtype} with a contiguous last dim")
    if t == 0:
        return out
    group = hq // hkv
    cfg = choose_config(t, hq, hkv, d, max_len, k_cache.element_size(), _num_sms(device), launch)
    rows = t * group
    m_tiles = triton.cdiv(rows, cfg.block_m)
    ieee = q.dtype == torch.float32
    # Triton's CPU interpreter (3.9) computes bf16 dots wrongly; there, upcast operands to float32.
    dot_f32 = interpreting() and q.dtype == torch.bfloat16
    split = cfg.num_splits > 1
    in_kernel = split and combine == "kernel"
    if split:
        part_ml = torch.empty((cfg.num_splits, hkv, rows, 2), dtype=torch.float32, device=device)
        part_acc = torch.empty((cfg.num_splits, hkv, rows, d), dtype=torch.float32, device=device)
    else:
        part_ml = part_acc = out  # unused by the kernel when NUM_SPLITS == 1
    counters = arrival_counters(workspace, m_tiles * hkv, device) if in_kernel else out  # out: unused
    scale_log2 = float(scale) * 1.4426950408889634  # exp(x) = exp2(x * log2(e))
    kd, vd = k_cache, v_cache  # unused without tma
    use_tma = cfg.tma and k_cache.is_contiguous() and v_cache.is_contiguous()
    if launch.tma and not use_tma:
        raise ValueError("tma needs contiguous k_cache and v_cache")
    if use_tma:
        if TensorDescriptor is None:
            raise ValueError("tma needs Triton's host tensor descriptors (triton.tools.tensor_descriptor)")
        kd, vd = (TensorDescriptor.from_tensor(c.view(hkv * max_len, d), [cfg.block_n, d]) for c in (k_cache, v_cache))
    _tree_attn_kernel[(m_tiles, hkv, cfg.num_splits)](
        q, k_cache, v_cache, kd, vd, prefix, packed_mask, out, part_ml, part_acc, counters,
        scale_log2, t, n, max_len, cfg.num_splits,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        packed_mask.stride(0), out.stride(0), out.stride(1),
        GROUP=group, HEAD_DIM=d, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        SPLIT=split, IEEE=ieee or dot_f32, DOT_F32=dot_f32,
        # SPLITS_P2 only shapes the in-kernel merge: 1 otherwise, so split counts share one compile.
        IN_KERNEL_COMBINE=in_kernel, SPLITS_P2=triton.next_power_of_2(cfg.num_splits) if in_kernel else 1, PDL=pdl_mode(pdl),
        TMA=use_tma, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **launch_options(pdl),
    )
    if split and not in_kernel:
        _combine_kernel[(rows, hkv)](
            prefix, part_ml, part_acc, out, t, n, max_len, cfg.num_splits, out.stride(0), out.stride(1),
            GROUP=group, HEAD_DIM=d, BLOCK_N=cfg.block_n, SPLITS_P2=triton.next_power_of_2(cfg.num_splits), PDL=pdl_mode(pdl),
            num_warps=4 if cfg.num_splits * d >= 4096 else 2, **launch_options(pdl),
        )
    return out
