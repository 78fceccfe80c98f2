"""Skinny linear layer y = x @ w.T (+ b) for a few token rows (the model: M <= 16), in one Triton launch.

Why: a batch-1 linear is a pure weight stream (every weight is read once, the x rows are tiny
and stay in L1/L2), and cuBLAS leaves a margin above the weight-bytes floor there (docs/decisions.md).

Two kinds, both one program per BLOCK_N weight rows (output columns) with all M token rows and a
loop over K:

* "dot" (the default): y.T = w @ x.T with `tl.dot` -- the weight rows on the MMA's M side, the
  token rows padded to 16 on its N side -- so the loop is a software-pipelined weight stream and
  tensor cores do the arithmetic; at or below cuBLAS on every Llama-3-8B linear at 1-16 rows.
* "fma": float32 broadcast multiply + sum over (BLOCK_M, BLOCK_N, BLOCK_K) tiles of 8192 products,
  no tensor cores. Competitive at 1 row only (its K step shrinks as M grows); kept as the simplest
  correct reference design.

The model runs it with `KernelConfig.linear` "triton" (the CUDA default) for forwards of at most
`linear_max_rows` (default MAX_ROWS) tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from swiftspec.kernels import interpreting
from swiftspec.kernels.counters import CounterWorkspace, arrival_counters
from swiftspec.kernels.int4 import Int4Weight, check_group, dequantize
from swiftspec.kernels.pdl import check_pdl, grid_release, grid_sync, launch_options, pdl_mode
from swiftspec.kernels.rope_kv import _check as check_rope  # the shapes `rope_kv` takes

SHARED_BYTES = 220 * 1024  # pipeline buffers' budget: Hopper has 227 KB of shared memory per block
MAX_ROWS = 16  # the model's default: more token rows go to F.linear (its measured range)
MAX_ROWS_DOT = 256  # the dot kind's limit, any weight dtype (token rows fill the MMA's N side)
MAX_ROWS_FP8 = MAX_ROWS_DOT  # fp8 weights: every forward (cuBLAS has no bf16 x fp8 GEMM), up to a prefill chunk
# native weights at <= 16 rows: (most column blocks, least K, split_k), first match wins. Too few column
# blocks leave most of the 132 SMs idle, so a long K is split (docs/decisions.md)
SPLIT_RULES = ((32, 4096, 4), (40, 8192, 2))
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3fn value
# PDL "prefetch": the bytes of weights (all programs together) a skinny linear asks the L2 for before
# its wait, and the most 128-byte lines per weight row of a program: a third of the H100's / H200's
# 50 MB L2, so the lines can outlive the predecessor's own streaming until they are read.
PREFETCH_BYTES = 16 << 20
PREFETCH_ROW_LINES = 32
INT4_TILE_ROWS = 128  # int4 rows per launch: a 256-row tile spills registers (sm_90)
MAX_ROWS_INT4 = MAX_ROWS_DOT  # int4 weights: every forward up to a prefill chunk (no int4 GEMM in torch)
# int4 linears split K only where N <= this (Llama-3-8B's shapes on the H100, docs/decisions.md: its
# gate/up, 28672 rows, runs fastest unsplit, qkv and o, 4096-6144 rows, split 4, down split 8)
INT4_SPLIT_MAX_N = 8192
COMBINES = ("separate", "kernel")  # how split-K partials are summed (`GemvLaunch.combine`)


@triton.jit
def _gemv_kernel(X, W, B, Y, M, N, K, stride_x, stride_w, stride_y, HAS_BIAS: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    grid_sync(PDL)
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
    grid_release(PDL)
    if HAS_BIAS:
        acc += tl.load(B + cols, mask=ok_n, other=0.0).to(tl.float32)[None, :]
    tl.store(Y + rows[:, None] * stride_y + cols[None, :], acc.to(Y.dtype.element_ty),
             mask=ok_m[:, None] & ok_n[None, :])


@triton.jit
def _skinny_dot_kernel(X, W, S, B, Y, P, SQ, CNT, RES, NEW_RES, eps, M, N, K, stride_x, stride_w, stride_y, stride_r,
                       COS, SIN, SLOTS, KC, VC, stride_cos, stride_kc_h, stride_kc_s, stride_vc_h, stride_vc_s, HQ, HKV,
                       SZ, ZP, stride_s, INT4: tl.constexpr, GROUP: tl.constexpr, EVEN_K: tl.constexpr, PTX: tl.constexpr,
                       X_AHEAD: tl.constexpr,
                       HAS_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr,
                       F16: tl.constexpr, X_F16: tl.constexpr, SPLIT_K: tl.constexpr, RMS: tl.constexpr,
                       HAS_RES: tl.constexpr, SWIGLU: tl.constexpr, ROPE: tl.constexpr, HALF: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
                       PF_LINES: tl.constexpr = 0, COMBINE: tl.constexpr = False):
    # y.T = w @ x.T: the weight rows fill the MMA's M side (>= 64 on Hopper), the few token rows
    # its N side (16), so tensor cores do the arithmetic and the loop is a pipelined weight stream.
    # SPLIT_K > 1: program (i, s) sums the s-th K slice into its own float32 partial in P
    # (SPLIT_K, M, N); `_split_sum_kernel` adds them in a fixed order (deterministic, unlike atomics).
    # RMS: y = (w @ h.T) / rms(h) with h = x (+ RES): the norm's weight is folded into w, so both dot
    # operands stay as loaded (x and RES feed two dots into two accumulators) and the squares of h
    # are summed on the side; program 0 stores h to NEW_RES. With SPLIT_K > 1 each split keeps its
    # partial unscaled and column block 0 stores the split's sum of squares in SQ (SPLIT_K, M): the
    # split-sum launch applies 1 / rms (and the bias) to the total.
    # COMBINE (SPLIT_K > 1): no split-sum launch. Each program counts its partial in CNT (one int32
    # per column block, zero between launches); the column block's last split to arrive adds the
    # partials in split order, as the split-sum launch does, so the result is the same bit for bit
    # whichever split arrives last, and sets the count back to zero. With RMS every program stores
    # its split's sum of squares, SQ (SPLIT_K, column blocks, M), so the last one needs no other
    # column block.
    # SWIGLU: W is a SwiGLU MLP's gate|up (N = 2F rows) and Y is (M, F): tile row 2i is gate row j,
    # row 2i + 1 up row j (j = the program's i-th output), so the epilogue holds both halves of its
    # outputs and applies silu(gate) * up; the K loop is the plain one.
    # ROPE: W is the fused qkv (N = (HQ + 2 HKV) * 2 HALF rows) and Y the rotated q (M, HQ, 2 HALF):
    # tile row 2i is column c of a head, row 2i + 1 column c + HALF (pair j = the program's i-th),
    # so the epilogue rotates its pairs (`_rope_store`) and writes q to Y, k and v to the caches.
    # INT4: W is packed int4 (N, K / 8) int32 with scales SZ and zero points ZP (N, K / GROUP)
    # float16 (`kernels.int4.Int4Weight`), taken a tile at a time by `_int4_tile`.
    # PF_LINES > 0 (PDL "prefetch"): before its wait each program asks the L2 for the first
    # PF_LINES 128-byte lines of its rows' K slice, and for int4 the slice's scales and zeros, so
    # its stream starts from the L2 (`_prefetch_l2`).
    rows = tl.arange(0, BLOCK_M)
    ok_m = rows < M
    if SWIGLU or ROPE:
        r = tl.arange(0, BLOCK_N)
        j = tl.program_id(0) * (BLOCK_N // 2) + r // 2
        if SWIGLU:
            cols = j + (r % 2) * (N // 2)
        else:
            cols = (j // HALF) * (2 * HALF) + j % HALF + (r % 2) * HALF
        ok_n = j < N // 2
    else:
        cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        ok_n = cols < N
    k_per = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
    k_lo = tl.program_id(1) * k_per
    k_hi = tl.minimum(K, k_lo + k_per)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    acc_r = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)  # RMS with HAS_RES: w @ RES.T
    sq = tl.zeros((BLOCK_K, BLOCK_M), dtype=tl.float32)  # RMS: squares of h, summed over K at the end
    k_first = k_lo
    if PDL == 1 and not INT4:
        # Early PDL: the weights are static, so start streaming the first tile before waiting for
        # the kernel that writes x; its DRAM latency overlaps that kernel's tail (see pdl.py).
        k_first = k_lo + BLOCK_K
        ks = k_lo + tl.arange(0, BLOCK_K)
        ok = (ks < k_hi)[:, None] & ok_m[None, :]
        w = tl.load(W + cols[:, None].to(tl.int64) * stride_w + ks[None, :], mask=ok_n[:, None] & (ks < k_hi)[None, :],
                    other=0.0)
        grid_sync(PDL)
        xt = tl.load(X + rows[None, :] * stride_x + ks[:, None], mask=ok, other=0.0)
        acc = _dot(w, xt, acc, IEEE, UPCAST, F16, X_F16)
        if RMS:
            acc_r, sq = _rms_tile(w, xt, acc_r, sq, RES, NEW_RES, rows, ks, ok, stride_r, IEEE, UPCAST, HAS_RES)
    else:
        if PF_LINES > 0:
            el_lo = k_lo // 8 if INT4 else k_lo  # in elements of W (int4: packed int32s)
            el_hi = k_hi // 8 if INT4 else k_hi
            PER_LINE: tl.constexpr = 1024 // W.dtype.element_ty.primitive_bitwidth  # elements a line
            lines = el_lo + tl.arange(0, PF_LINES) * PER_LINE
            row_base = W + cols[:, None].to(tl.int64) * stride_w
            _prefetch_l2(row_base + lines[None, :], ok_n[:, None] & (lines < el_hi)[None, :], W)
            if INT4:
                _prefetch_l2(SZ + cols * stride_s + k_lo // GROUP, ok_n, SZ)
                _prefetch_l2(ZP + cols * stride_s + k_lo // GROUP, ok_n, ZP)
        grid_sync(PDL)
    if INT4 and X_AHEAD:  # int4: each tile's x gathered one tile ahead (`GemvLaunch.int4_x_ahead`)
        k_next = k_first
        if EVEN_K:  # a split past K (no tiles): its last tile's place instead, in bounds and unused
            k_next = tl.minimum(k_next, k_hi - BLOCK_K)
        x_next = _int4_x(X, rows, ok_m, k_next, k_hi, stride_x, BLOCK_K, EVEN_K)
    for k0 in range(k_first, k_hi, BLOCK_K):
        if INT4:
            if X_AHEAD:
                xt = x_next
                k_next = k0 + BLOCK_K  # past k_hi: masked, or (EVEN_K) the last tile again, in bounds and unused
                if EVEN_K:
                    k_next = tl.minimum(k_next, k_hi - BLOCK_K)
                x_next = _int4_x(X, rows, ok_m, k_next, k_hi, stride_x, BLOCK_K, EVEN_K)
            else:
                xt = _int4_x(X, rows, ok_m, k0, k_hi, stride_x, BLOCK_K, EVEN_K)
            acc = _int4_tile(W, SZ, ZP, xt, acc, cols, ok_n, k0, k_hi, stride_w, stride_s, GROUP, BLOCK_K, EVEN_K, IEEE,
                             UPCAST, PTX)
        else:
            ks = k0 + tl.arange(0, BLOCK_K)
            ok_k = ks < k_hi
            w = tl.load(W + cols[:, None].to(tl.int64) * stride_w + ks[None, :], mask=ok_n[:, None] & ok_k[None, :],
                        other=0.0)  # (BLOCK_N, BLOCK_K)
            xt = tl.load(X + rows[None, :] * stride_x + ks[:, None], mask=ok_k[:, None] & ok_m[None, :],
                         other=0.0)  # (BLOCK_K, BLOCK_M)
            acc = _dot(w, xt, acc, IEEE, UPCAST, F16, X_F16)
            if RMS:
                acc_r, sq = _rms_tile(w, xt, acc_r, sq, RES, NEW_RES, rows, ks, ok_k[:, None] & ok_m[None, :],
                                      stride_r, IEEE, UPCAST, HAS_RES)
    grid_release(PDL)  # late PDL: the next kernel may launch during this epilogue
    if RMS:
        acc += acc_r
        if SPLIT_K == 1:
            acc *= tl.rsqrt(tl.sum(sq, axis=0) / K + eps)[None, :]
        elif COMBINE:  # each column block's last split reads its own column block's squares
            tl.store(SQ + (tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)) * M + rows, tl.sum(sq, axis=0),
                     mask=ok_m)
        elif tl.program_id(0) == 0:  # every column block has the same squares: one stores them
            tl.store(SQ + tl.program_id(1) * M + rows, tl.sum(sq, axis=0), mask=ok_m)
    if HAS_SCALE:  # fp8 weights: one scale per weight row (output column), constant over K
        acc *= tl.load(S + cols, mask=ok_n, other=0.0)[:, None]
    if HAS_BIAS and not (RMS and SPLIT_K > 1):  # RMS with split K: the sum launch adds it after the scale
        if tl.program_id(1) == 0:  # the bias once, in the first K slice
            acc += tl.load(B + cols, mask=ok_n, other=0.0).to(tl.float32)[:, None]
    if SPLIT_K == 1:
        _dot_out(acc, Y, rows, cols, ok_m, ok_n, N, stride_y, COS, SIN, SLOTS, KC, VC, stride_cos, stride_kc_h,
                 stride_kc_s, stride_vc_h, stride_vc_s, HQ, HKV, SWIGLU, ROPE, HALF, BLOCK_M, BLOCK_N)
    else:
        tile = rows[None, :] * N + cols[:, None]
        ok = ok_n[:, None] & ok_m[None, :]
        tl.store(P + tl.program_id(1) * M * N + tile, acc, mask=ok)
        if COMBINE:
            tl.debug_barrier()  # every thread's partial is stored before the count says so
            arrived = tl.atomic_add(CNT + tl.program_id(0), 1, sem="acq_rel", scope="gpu")
            if arrived == SPLIT_K - 1:  # the column block's last split: the others' partials are in P
                tl.atomic_xchg(CNT + tl.program_id(0), 0, sem="relaxed", scope="gpu")  # zero for the next launch
                acc = tl.load(P + tile, mask=ok, other=0.0, cache_modifier=".cg")  # from the L2, never a stale L1
                for s in tl.static_range(1, SPLIT_K):
                    acc += tl.load(P + s * M * N + tile, mask=ok, other=0.0, cache_modifier=".cg")
                if RMS:  # as the split-sum launch: the total scaled by 1 / rms(h), then the bias
                    sq_at = SQ + tl.program_id(0) * M + rows
                    ss = tl.load(sq_at, mask=ok_m, other=0.0, cache_modifier=".cg")
                    for s in tl.static_range(1, SPLIT_K):
                        ss += tl.load(sq_at + s * tl.num_programs(0) * M, mask=ok_m, other=0.0, cache_modifier=".cg")
                    acc *= tl.rsqrt(ss / K + eps)[None, :]
                    if HAS_BIAS:
                        acc += tl.load(B + cols, mask=ok_n, other=0.0).to(tl.float32)[:, None]
                _dot_out(acc, Y, rows, cols, ok_m, ok_n, N, stride_y, COS, SIN, SLOTS, KC, VC, stride_cos, stride_kc_h,
                         stride_kc_s, stride_vc_h, stride_vc_s, HQ, HKV, SWIGLU, ROPE, HALF, BLOCK_M, BLOCK_N)


@triton.jit
def _dot_out(acc, Y, rows, cols, ok_m, ok_n, N, stride_y, COS, SIN, SLOTS, KC, VC, stride_cos, stride_kc_h, stride_kc_s,
             stride_vc_h, stride_vc_s, HQ, HKV, SWIGLU: tl.constexpr, ROPE: tl.constexpr, HALF: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Store a column block's finished acc (BLOCK_N, BLOCK_M), float32: y = acc in Y's dtype, or
    (SWIGLU, ROPE: tile row 2i and 2i + 1 a pair, see `_skinny_dot_kernel`) silu(gate) * up, or q
    rotated into Y and k, v into the caches."""
    if SWIGLU or ROPE:
        # rounded as the unfused path rounds: the projection stored in Y's dtype, then the next op
        acc = acc.to(Y.dtype.element_ty).to(tl.float32)
        g, u = tl.split(tl.permute(tl.reshape(acc, (BLOCK_N // 2, 2, BLOCK_M)), (0, 2, 1)))  # (BLOCK_N/2, BLOCK_M)
        out = tl.program_id(0) * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
        ok = (out < N // 2)[:, None] & ok_m[None, :]
        if SWIGLU:
            tl.store(Y + rows[None, :] * stride_y + out[:, None], _swiglu(g, u, Y.dtype.element_ty), mask=ok)
        else:
            _rope_store(g, u, out[:, None] + rows[None, :] * 0, rows[None, :] + out[:, None] * 0, ok, Y, stride_y,
                        COS, SIN, SLOTS, KC, VC, stride_cos, stride_kc_h, stride_kc_s, stride_vc_h, stride_vc_s,
                        HQ, HKV, HALF)
    else:
        tl.store(Y + rows[None, :] * stride_y + cols[:, None], acc.to(Y.dtype.element_ty),
                 mask=ok_n[:, None] & ok_m[None, :])


@triton.jit
def _prefetch_l2(ptrs, mask, safe):
    """Ask the L2 for the 128-byte line of each pointer where `mask` holds (no register is written,
    nothing waits for it); elsewhere for `safe`'s line, so every address stays in bounds."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [tl.where(mask, ptrs, safe)],
                              dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _int4_x(X, rows, ok_m, k0, k_hi, stride_x, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    """The x tile `_int4_tile` dots, (BLOCK_K, BLOCK_M): row c holds input k0 + 8 (c % KP) + c // KP
    (KP = BLOCK_K / 8), zero at and beyond k_hi unless EVEN_K."""
    KP: tl.constexpr = BLOCK_K // 8
    c = tl.arange(0, BLOCK_K)
    ks = k0 + 8 * (c % KP) + c // KP  # the input of widened column c
    ok = ok_m[None, :] if EVEN_K else (ks < k_hi)[:, None] & ok_m[None, :]
    return tl.load(X + rows[None, :] * stride_x + ks[:, None], mask=ok, other=0.0)


@triton.jit
def _int4_tile(W, SZ, ZP, xt, acc, cols, ok_n, k0, k_hi, stride_w, stride_s, GROUP: tl.constexpr, BLOCK_K: tl.constexpr,
               EVEN_K: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr, PTX: tl.constexpr):
    """acc (BLOCK_N, BLOCK_M) += the int4 weight tile of rows `cols`, inputs k0 + arange(BLOCK_K)
    below k_hi, @ xt, the x tile of the same inputs in `_int4_x`'s order.

    Packed int32 j of a row holds inputs 8j..8j+7 (nibble i: input 8j + i). The tile's (BLOCK_N,
    KP = BLOCK_K / 8) packs are widened into 8 slices, slice i = nibble i of every pack, and the
    slices are laid side by side (column i KP + j = input k0 + 8j + i) by joins, a permute and a
    reshape that move no data: each thread holds the packs of the columns it feeds the MMA, so the
    widened tile is already the dot's operand and one dot takes the whole tile. x is gathered in
    the same column order (`_int4_x`). A sum over K may add in any order, so only the pairing matters.
    One group per tile (BLOCK_K <= GROUP) and bf16 / fp16 x: a slice enters the tensor cores as
    the exact integers q - z, made without a conversion instruction: the bits q OR those of
    off = 128 (bf16) / 1024 (fp16) are the number off + q, minus off + z in x's dtype (zero points
    are integers: the format packs them in 4 bits); the group's scale applies once per tile to the
    float32 sum. Otherwise (float32 x, groups narrower than the tile) each slice is dequantized,
    (q - z) * s with its packs' scales and zeros, rounded to x's dtype. EVEN_K: k_hi - k0 is a
    multiple of BLOCK_K, so the loads need no mask over K (and vectorize)."""
    KP: tl.constexpr = BLOCK_K // 8
    dtype: tl.constexpr = xt.dtype
    FACTOR: tl.constexpr = (BLOCK_K <= GROUP) and (dtype != tl.float32)
    kp = k0 // 8 + tl.arange(0, KP)
    if EVEN_K:
        p = tl.load(W + cols[:, None].to(tl.int64) * stride_w + kp[None, :], mask=ok_n[:, None], other=0)
    else:
        ok_p = kp * 8 < k_hi  # K and k_hi are multiples of 8
        p = tl.load(W + cols[:, None].to(tl.int64) * stride_w + kp[None, :], mask=ok_n[:, None] & ok_p[None, :],
                    other=0)
    if FACTOR:
        s = tl.load(SZ + cols * stride_s + k0 // GROUP, mask=ok_n, other=0.0).to(tl.float32)
        z = tl.load(ZP + cols * stride_s + k0 // GROUP, mask=ok_n, other=0.0).to(tl.float32)
        off_z = (z + (128.0 if dtype == tl.bfloat16 else 1024.0))[:, None]  # exact in x's dtype
        if not UPCAST:  # subtract in x's dtype, two at a time (`_interpreted_bf16`: not interpreted)
            off_z = off_z.to(dtype)
        w = _int4_slices(p, off_z, off_z, dtype, True, UPCAST, PTX)
        part = _dot(w, xt, tl.zeros(acc.shape, dtype=tl.float32), IEEE, UPCAST, False, False)
        acc += s[:, None] * part
    else:
        gk = (kp * 8) // GROUP
        ok = ok_n[:, None] & (gk * GROUP < k_hi)[None, :]
        s = tl.load(SZ + cols[:, None] * stride_s + gk[None, :], mask=ok, other=0.0).to(tl.float32)
        z = tl.load(ZP + cols[:, None] * stride_s + gk[None, :], mask=ok, other=0.0).to(tl.float32)
        w = _int4_slices(p, z, s, dtype, False, UPCAST, PTX)
        acc = _dot(w, xt, acc, IEEE, UPCAST, False, False)
    return acc


@triton.jit
def _int4_slice(p, i: tl.constexpr, a, b, dtype: tl.constexpr, FACTOR: tl.constexpr, UPCAST: tl.constexpr):
    """Nibble i of every pack p (BLOCK_N, KP) as x's dtype: FACTOR: q - z with a = off + z (see
    `_int4_tile`); else (q - z) * s with a = z, b = s (float32, per pack)."""
    q = (p >> (4 * i)) & 0xF
    if FACTOR:
        if dtype == tl.bfloat16:
            w = (q | 0x4300).to(tl.int16).to(tl.bfloat16, bitcast=True)  # 128 + q
        else:
            w = (q | 0x6400).to(tl.int16).to(tl.float16, bitcast=True)  # 1024 + q
        w = ((w.to(tl.float32) - a) if UPCAST else (w - a)).to(dtype)  # q - z
    else:
        w = ((q.to(tl.float32) - a) * b).to(dtype)
    return w


@triton.jit
def _int4_slices(p, a, b, dtype: tl.constexpr, FACTOR: tl.constexpr, UPCAST: tl.constexpr, PTX: tl.constexpr):
    """The 8 slices of packs p (BLOCK_N, KP) side by side: (BLOCK_N, 8 KP), column i KP + j =
    nibble i of pack j (`_int4_slice`; with PTX and FACTOR all 8 at once by `_int4_ptx`)."""
    if FACTOR and PTX:
        w0, w1, w2, w3, w4, w5, w6, w7 = _int4_ptx(p, tl.broadcast_to(a, p.shape), dtype)
    else:
        w0 = _int4_slice(p, 0, a, b, dtype, FACTOR, UPCAST)
        w1 = _int4_slice(p, 1, a, b, dtype, FACTOR, UPCAST)
        w2 = _int4_slice(p, 2, a, b, dtype, FACTOR, UPCAST)
        w3 = _int4_slice(p, 3, a, b, dtype, FACTOR, UPCAST)
        w4 = _int4_slice(p, 4, a, b, dtype, FACTOR, UPCAST)
        w5 = _int4_slice(p, 5, a, b, dtype, FACTOR, UPCAST)
        w6 = _int4_slice(p, 6, a, b, dtype, FACTOR, UPCAST)
        w7 = _int4_slice(p, 7, a, b, dtype, FACTOR, UPCAST)
    w = tl.join(tl.join(tl.join(w0, w1), tl.join(w2, w3)), tl.join(tl.join(w4, w5), tl.join(w6, w7)))
    # w (BLOCK_N, KP, 2, 2, 2) is [n, j, i % 2, i // 2 % 2, i // 4]: put i before j, then merge
    return tl.reshape(tl.permute(w, (0, 4, 3, 2, 1)), (w.shape[0], 8 * w.shape[1]))


def _int4_ptx_text(magic: str, sub: str) -> str:
    """`_int4_ptx`'s PTX: outputs $0..$7 (slice i = nibble i of packs $8 and $9, as off + q in two
    16-bit lanes, minus $10 = off + z twice)."""
    steps = []
    for i in range(8):
        src, shift = ("lo", "hi")[i // 4], 4 * (i % 4)
        steps.append(f"shr.u32 t, {src}, {shift};" if shift else f"mov.b32 t, {src};")
        steps.append(f"lop3.b32 t, t, 0x000F000F, {magic}, 0xea; {sub} ${i}, t, $10;")  # 0xea: (a & b) | c
    return ("{ .reg .b32 lo, hi, t; prmt.b32 lo, $8, $9, 0x5410; prmt.b32 hi, $8, $9, 0x7632; "
            + " ".join(steps) + " }")


_INT4_PTX_BF16 = tl.constexpr(_int4_ptx_text("0x43004300", "sub.rn.bf16x2"))
_INT4_PTX_F16 = tl.constexpr(_int4_ptx_text("0x64006400", "sub.rn.f16x2"))


@triton.jit
def _int4_ptx(p, off_z, dtype: tl.constexpr):
    """The 8 slices `_int4_slice` makes with FACTOR, two packs per step in PTX: the low and the high
    halves of two packs are gathered into one register each (prmt), so one shift and one lop3 give
    nibble i of both packs as the bits of off + q in two 16-bit lanes, and one packed subtraction of
    off + z (off_z, broadcast to p's shape, x's dtype) leaves q - z: 1.5 instructions a weight,
    half of what the elementwise form compiles to."""
    if dtype == tl.bfloat16:
        return tl.inline_asm_elementwise(_INT4_PTX_BF16, "=r,=r,=r,=r,=r,=r,=r,=r,r,r,r", [p, off_z],
                                         dtype=(tl.bfloat16,) * 8, is_pure=True, pack=2)
    else:
        return tl.inline_asm_elementwise(_INT4_PTX_F16, "=r,=r,=r,=r,=r,=r,=r,=r,r,r,r", [p, off_z],
                                         dtype=(tl.float16,) * 8, is_pure=True, pack=2)


@triton.jit
def _rms_tile(w, xt, acc_r, sq, RES, NEW_RES, rows, ks, ok, stride_r, IEEE: tl.constexpr, UPCAST: tl.constexpr,
              HAS_RES: tl.constexpr):
    """One K step of the RMS kind: acc_r += w @ res tile (HAS_RES), sq += h * h elementwise with
    h = x (+ res) rounded to x's dtype as `add_rmsnorm` rounds it; program 0 stores h."""
    if HAS_RES:
        rt = tl.load(RES + rows[None, :] * stride_r + ks[:, None], mask=ok, other=0.0)
        acc_r = _dot(w, rt, acc_r, IEEE, UPCAST, False, False)
        h = (xt.to(tl.float32) + rt.to(tl.float32)).to(xt.dtype)
        if tl.program_id(0) == 0:
            tl.store(NEW_RES + rows[None, :] * stride_r + ks[:, None], h, mask=ok)
        hf = h.to(tl.float32)
    else:
        hf = xt.to(tl.float32)
    return acc_r, sq + hf * hf


@triton.jit
def _split_sum_kernel(P, Y, B, SQ, eps, M, N, K, stride_y, COS, SIN, SLOTS, KC, VC, stride_cos, stride_kc_h,
                      stride_kc_s, stride_vc_h, stride_vc_s, HQ, HKV, SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr,
                      RMS: tl.constexpr, SWIGLU: tl.constexpr, ROPE: tl.constexpr, HALF: tl.constexpr,
                      BLOCK: tl.constexpr, PDL: tl.constexpr):
    """Y (M, N) = sum over s of P (SPLIT_K, M, N) in s order, cast to Y's dtype. RMS: P holds the
    folded norm's unscaled partials and SQ (SPLIT_K, M) the splits' sums of squares of h (over K
    columns): the sum is scaled by 1 / rms(h), then the bias (HAS_BIAS, only with RMS: otherwise
    split 0 added it) is added. SWIGLU: P holds (M, N) gate|up partials and Y (M, N / 2) gets
    silu(gate) * up of the sums. ROPE: P holds (M, N) qkv partials, one program element per pair
    (column c and c + HALF of a head), rotated and stored as `_rope_store` does."""
    grid_sync(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    F = N // 2
    if ROPE or SWIGLU:
        m, j = offs // F, offs % F
        ok = offs < M * F
    else:
        m, j = offs // N, offs % N
        ok = offs < M * N
    inv = tl.zeros_like(offs.to(tl.float32)) + 1.0
    if RMS:
        ss = tl.load(SQ + m, mask=ok, other=0.0)
        for s in tl.static_range(1, SPLIT_K):
            ss += tl.load(SQ + s * M + m, mask=ok, other=0.0)
        inv = tl.rsqrt(ss / K + eps)
    dt = Y.dtype.element_ty
    if ROPE:
        c1 = (j // HALF) * (2 * HALF) + j % HALF  # column c of pair j; its partner is HALF further
        x1, x2 = _sum_pair(P, m * N + c1, HALF, ok, M * N, SPLIT_K)
        x1, x2 = x1 * inv, x2 * inv
        if HAS_BIAS:
            x1 += tl.load(B + c1, mask=ok, other=0.0).to(tl.float32)
            x2 += tl.load(B + c1 + HALF, mask=ok, other=0.0).to(tl.float32)
        _rope_store(x1.to(dt).to(tl.float32), x2.to(dt).to(tl.float32), j, m, ok, Y, stride_y, COS, SIN, SLOTS, KC,
                    VC, stride_cos, stride_kc_h, stride_kc_s, stride_vc_h, stride_vc_s, HQ, HKV, HALF)
    elif SWIGLU:  # no bias (gemv refuses one)
        g, u = _sum_pair(P, m * N + j, F, ok, M * N, SPLIT_K)  # gate column j of row m; its up column is F further
        tl.store(Y + offs, _swiglu((g * inv).to(dt).to(tl.float32), (u * inv).to(dt).to(tl.float32), dt), mask=ok)
    else:
        acc = tl.load(P + offs, mask=ok, other=0.0)
        for s in tl.static_range(1, SPLIT_K):
            acc += tl.load(P + s * M * N + offs, mask=ok, other=0.0)
        acc *= inv
        if HAS_BIAS:
            acc += tl.load(B + j, mask=ok, other=0.0).to(tl.float32)
        tl.store(Y + offs, acc.to(dt), mask=ok)


@triton.jit
def _sum_pair(P, src, other, ok, STRIDE, SPLIT_K: tl.constexpr):
    """The sums, in split order, of the SPLIT_K partials (STRIDE elements apart) at src and at
    src + other."""
    a = tl.load(P + src, mask=ok, other=0.0)
    b = tl.load(P + src + other, mask=ok, other=0.0)
    for s in tl.static_range(1, SPLIT_K):
        a += tl.load(P + s * STRIDE + src, mask=ok, other=0.0)
        b += tl.load(P + s * STRIDE + src + other, mask=ok, other=0.0)
    return a, b


@triton.jit
def _rope_store(x1, x2, j, m, ok, Q, stride_q, COS, SIN, SLOTS, KC, VC, stride_cos, stride_kc_h, stride_kc_s,
                stride_vc_h, stride_vc_s, HQ, HKV, HALF: tl.constexpr):
    """RoPE + KV write of qkv pairs: x1, x2 (any shape, float32 values of Q's dtype) are columns
    c and c + HALF of head j // HALF (c = j % HALF) for token row m (j, m: that shape). q heads
    (< HQ) are rotated into Q (M, HQ, 2 HALF; row stride stride_q), k heads rotated into KC and v
    heads copied into VC ((HKV, S, 2 HALF) caches) at slot SLOTS[m]. Rotation and roundings as
    `rope_kv` (`_rotate`): x * cos + rotate_half(x) * sin, each product and the sum rounded."""
    dt = Q.dtype.element_ty
    head, c = j // HALF, j % HALF
    cs = COS + m * stride_cos + c
    ss = SIN + m * stride_cos + c
    c1 = tl.load(cs, mask=ok, other=0.0).to(tl.float32)
    c2 = tl.load(cs + HALF, mask=ok, other=0.0).to(tl.float32)
    s1 = tl.load(ss, mask=ok, other=0.0).to(tl.float32)
    s2 = tl.load(ss + HALF, mask=ok, other=0.0).to(tl.float32)
    a1 = (x1 * c1).to(dt).to(tl.float32)
    b1 = (x2 * s1).to(dt).to(tl.float32)
    a2 = (x2 * c2).to(dt).to(tl.float32)
    b2 = (x1 * s2).to(dt).to(tl.float32)
    is_q, is_v = head < HQ, head >= HQ + HKV
    o1 = tl.where(is_v, x1, (a1 - b1).to(dt).to(tl.float32)).to(dt)
    o2 = tl.where(is_v, x2, (a2 + b2).to(dt).to(tl.float32)).to(dt)
    qd = Q + m * stride_q + head * (2 * HALF) + c
    tl.store(qd, o1, mask=ok & is_q)
    tl.store(qd + HALF, o2, mask=ok & is_q)
    slot = tl.load(SLOTS + m, mask=ok & ~is_q, other=0).to(tl.int64)
    is_k = ~is_q & ~is_v
    kd = KC + (head - HQ) * stride_kc_h + slot * stride_kc_s + c
    tl.store(kd, o1, mask=ok & is_k)
    tl.store(kd + HALF, o2, mask=ok & is_k)
    vd = VC + (head - HQ - HKV) * stride_vc_h + slot * stride_vc_s + c
    tl.store(vd, o1, mask=ok & is_v)
    tl.store(vd + HALF, o2, mask=ok & is_v)


@triton.jit
def _swiglu(g, u, dtype: tl.constexpr):
    """silu(g) * u as `silu_mul` rounds it (g, u float32 values of the dtype): silu in float32
    rounded to the dtype, then the product rounded."""
    sg = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)
    return (sg * u).to(dtype)


@triton.jit
def _dot(w, xt, acc, IEEE: tl.constexpr, UPCAST: tl.constexpr, F16: tl.constexpr, X_F16: tl.constexpr):
    """acc (BLOCK_N, BLOCK_M) += w (BLOCK_N, BLOCK_K) @ xt (BLOCK_K, BLOCK_M).

    fp8 weights are widened in registers (the bytes saved are in the load). F16: both operands in
    float16, because e4m3 -> float16 is one instruction per two weights on Hopper and e4m3 ->
    bfloat16 is not (`benchmarks/sweep_fp8_widen.py`; docs/decisions.md). Every e4m3 value and
    every bfloat16 x in +-65504 is exact in float16 (bfloat16 x below 2^-14 loses low bits); x
    beyond that range saturates instead of becoming inf."""
    if F16:
        w = w.to(tl.float16)
        if not X_F16:  # x converted before the launch (`GemvLaunch.x_f16`)
            xt = tl.clamp(xt.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
    else:
        w = w.to(xt.dtype)
    if UPCAST:  # see `_interpreted_bf16`
        w, xt = w.to(tl.float32), xt.to(tl.float32)
    if IEEE:
        acc = tl.dot(w, xt, acc, input_precision="ieee")
    else:
        acc = tl.dot(w, xt, acc)
    return acc


def _ptx() -> bool:
    """Whether the kernels compile for an NVIDIA GPU, where inline PTX may run (not interpreted, not
    ROCm)."""
    return not interpreting() and torch.version.hip is None


def _interpreted_bf16(dtype: torch.dtype) -> bool:
    """Triton 3.9's CPU interpreter returns garbage from `tl.dot` on bfloat16 tiles (float16 and
    float32 are right), so there the dot kernel upcasts them: bf16 x bf16 products are exact in
    float32, the result is the same up to summation order."""
    return dtype == torch.bfloat16 and interpreting()


@dataclass(frozen=True)
class DotConfig:
    """Launch shape of the dot kind: token rows padded to block_m, block_n weight rows and block_k of
    K per step."""
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    split_k: int


@dataclass(frozen=True)
class GemvLaunch:
    """How `gemv` launches: overrides of its launch shape (None: the measured defaults of
    `dot_config` / `gemv_config`; benchmarks, tests) and its split-K sum (the model's). split_k > 1
    (kind "dot") splits K over that many programs per column block. x_f16 (fp8 weights, bf16/fp16 x): convert x to float16 once before the launch
    instead of in every program at every K step: the same result bit for bit, meant for many rows,
    where the x tile outgrows the weight tile (not measured, so off by default). int4_x_ahead (int4
    weights): gather the next tile's x while this tile's MMA runs, so the gather's L2 latency is
    not paid once per tile; None: `int4_x_ahead_on` (on up to 64 rows, measured faster on the
    H100, docs/decisions.md). int4_split_max_n (int4 weights): split K only where N is at most
    this (None: `INT4_SPLIT_MAX_N`). combine: how split-K partials are summed, "separate" (a second launch,
    `_split_sum_kernel`) or "kernel" (the last split of each column block to finish, one launch);
    workspace: its counters, shared by the launches of one stream (`kernels.counters`; None: each
    split launch zeroes fresh ones, one memset)."""

    block_n: int | None = None
    block_k: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    split_k: int | None = None
    x_f16: bool = False
    int4_x_ahead: bool | None = None
    int4_split_max_n: int | None = None
    combine: str = "separate"
    workspace: CounterWorkspace | None = None

    def __post_init__(self) -> None:
        if self.combine not in COMBINES:
            raise ValueError(f"combine must be one of {', '.join(COMBINES)}, got {self.combine!r}")


@dataclass(frozen=True)
class Epilogue:
    """What `gemv` does around the product besides the bias (kind "dot"; each saves a launch).

    rms_eps: the input is RMSNorm(h) with h = x + residual (x alone without one) and the norm's
    weight folded into the GEMM weight (`fold_norm_weight`); residual_out (M, K) receives h (needed
    with a residual). act "swiglu": the weight is a fused gate|up (2F, K), the result
    silu(gate) * up (M, F). rope: the weight is a fused qkv projection, the result the rotated q
    (M, Hq, D), k and v written into the cache (`RopeKV`)."""

    rms_eps: float | None = None
    residual: torch.Tensor | None = None
    residual_out: torch.Tensor | None = None
    act: str | None = None
    rope: RopeKV | None = None


def dot_config(m: int, n: int, k: int, w_bytes: float, x_bytes: int, *, fp8: bool = False, int4: bool = False,
               pdl: bool | str = False, residual: bool = False, norm: bool = False,
               launch: GemvLaunch | None = None) -> DotConfig:
    """The dot kind's launch shape for x (m, k) @ w (n, k).T, w_bytes / x_bytes per element (residual:
    a second x-sized tile per K step, `Epilogue.residual`; norm: `Epilogue.rms_eps` given, which
    splits K by the same rule: the split-sum launch applies the scale); `launch`'s fields override
    the measured defaults below."""
    lc = launch or GemvLaunch()
    block_n, block_k, num_warps, num_stages = lc.block_n, lc.block_k, lc.num_warps, lc.num_stages
    split_k = lc.split_k
    bm = max(16, triton.next_power_of_2(m))
    if int4:
        # the H100's best (benchmarks/results/int4_h100): at 1-16 rows 64 weight rows over 4 warps, K
        # split so a program streams ~8 tiles where N <= INT4_SPLIT_MAX_N (4 ways at K 4096, 8 at
        # 14336; small kernels need many programs in flight); from 32 rows 128 over 8 warps (fewer x
        # reloads), K split 4 there; 128-wide K steps: one group of the usual 128 (scale once per tile)
        small = bm <= 16
        bn, bk = block_n or (64 if small else 128), block_k or 128
        num_warps = num_warps or (4 if small else 8)
        wide = n > (lc.int4_split_max_n or INT4_SPLIT_MAX_N)
        split_k = split_k or (1 if wide else min(8, max(1, k // 1024)) if small else 4)
    elif fp8:
        # the H200's best at 1-256 rows (docs/decisions.md): at 1-16 rows and N <= 8192 (qkv, o,
        # down) 64 weight rows per program, 4 warps, 4 stages, else 128, 8 warps, 3 stages; K in
        # 128-wide steps, split in 4 where N <= 8192 (too few column blocks to fill the GPU)
        wide = n > 8192
        small = bm <= 16 and not wide
        bn, bk = block_n or (64 if small else 128), block_k or 128
        num_warps, split_k = num_warps or (4 if small else 8), split_k or (1 if wide else 4)
        num_stages = num_stages or (4 if small else 3)
    else:
        # the H200's best at 1-16 rows (docs/decisions.md): 64 weight rows per program, 256-wide K
        # steps for N <= 4096 outputs (o, down: fewer programs, so each keeps more bytes in flight),
        # 128 otherwise, 5 pipeline stages or as many as fit SHARED_BYTES
        bn, bk = block_n or 64, block_k or (256 if n <= 4096 and bm <= 16 else 128 if bm <= 64 else 64)
        if not split_k:
            split_k = 1 if bm > 16 else native_split(triton.cdiv(n, bn), k)
    num_warps, split_k = num_warps or 4, min(split_k or 1, triton.cdiv(k, bk))
    stage_bytes = (bn * w_bytes + bm * x_bytes * (2 if residual else 1)) * bk  # weight tile + x (+ residual) tile
    # with early pdl the first tile, loaded before the pipelined loop, takes one more stage's room
    room = SHARED_BYTES - (stage_bytes if pdl_mode(pdl) == 1 else 0)
    num_stages = num_stages or max(1, min(5, int(room // stage_bytes)))
    return DotConfig(bm, bn, bk, num_warps, num_stages, split_k)


def int4_x_ahead_on(launch: GemvLaunch, block_m: int) -> bool:
    """Whether an int4 launch of block_m padded token rows gathers x a tile ahead: the launch's
    choice, else on up to 64 rows (one layer's 8B linears on the H100: 0.91-0.93 of the gather at
    the top of each tile at 1-16 rows, 0.86 at 32, 0.88 at 64) and off above (1.16 at 128: the
    larger x tile held across the iteration costs more than the wait it hides)."""
    return block_m <= 64 if launch.int4_x_ahead is None else launch.int4_x_ahead


def prefetch_lines(n: int, k: int, el_bytes: int, cfg: DotConfig, int4: bool = False) -> int:
    """PDL "prefetch": the 128-byte lines per weight row each program of an (n, k) skinny linear asks
    the L2 for before its wait: its K slice's lines (el_bytes per element of W; int4: 4 per packed
    int32 of 8 inputs), at most `PREFETCH_ROW_LINES` and what keeps all programs together within
    `PREFETCH_BYTES`; a power of two, at least 1."""
    k_per = triton.cdiv(triton.cdiv(k, cfg.split_k), cfg.block_k) * cfg.block_k
    row_lines = triton.cdiv((k_per // 8 if int4 else k_per) * el_bytes, 128)
    budget = PREFETCH_BYTES // (n * cfg.split_k * 128)
    most = max(1, min(row_lines, budget, PREFETCH_ROW_LINES))
    return 1 << (most.bit_length() - 1)


def native_split(blocks: int, k: int) -> int:
    """split_k for native weights at <= 16 rows: `SPLIT_RULES`' first match for this many column
    blocks and this K, else 1."""
    return next((split for most, least_k, split in SPLIT_RULES if blocks <= most and k >= least_k), 1)


@dataclass(frozen=True)
class RopeKV:
    """What `Epilogue.rope` needs to finish a fused qkv projection in its epilogue, as `rope_kv`
    takes it: cos, sin (T, D) rows in x's dtype; slots (T,) int32/int64 cache slots on the device;
    k_cache, v_cache (Hkv, S, D) of one layer, written in place; this shard's q_heads, kv_heads."""
    cos: torch.Tensor
    sin: torch.Tensor
    slots: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    q_heads: int
    kv_heads: int


_NO_EPILOGUE, _DEFAULT_LAUNCH = Epilogue(), GemvLaunch()


def gemv_config(m: int, block_n: int | None = None, block_k: int | None = None) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K) for m token rows: 8192 products per K step unless overridden."""
    bm = triton.next_power_of_2(max(1, m))
    bn = block_n or 16
    bk = block_k or max(16, 8192 // (bm * bn))
    return bm, bn, bk


def gemv(x: torch.Tensor, weight: torch.Tensor | Int4Weight, bias: torch.Tensor | None = None, *,
         scale: torch.Tensor | None = None, kind: str = "dot", pdl: bool | str = False,
         epilogue: Epilogue | None = None, launch: GemvLaunch | None = None) -> torch.Tensor:
    """x (M, K) @ weight (N, K).T + bias (N,) -> (M, N) in x's dtype, float32 accumulation.

    M <= 256 (MAX_ROWS_DOT) with kind "dot", M <= 16 (MAX_ROWS) with "fma"; the model uses it up to
    16 rows by default (`KernelConfig.linear_max_rows`). x and weight need a contiguous last dim.
    Grid ceil(N / BLOCK_N) x split_k; no host sync, so it can be captured in a CUDA graph.
    launch: block sizes, num_warps, num_stages (Triton's software pipelining depth of the K loop),
    split_k and x_f16 (`GemvLaunch`; None: the measured configs of `dot_config` / `gemv_config`).
    epilogue: the fused norm, residual, activation and RoPE described below (`Epilogue`).

    fp8 weights (float8_e4m3fn, from `quantize_fp8`) need `scale` (N,) float32, the per-row scale:
    y = x @ (weight * scale[:, None]).T + bias, half the bytes of bf16 weights; kind "dot" only
    (the token rows fill the MMA's N side, padded to a power of two >= 16).
    With bfloat16/float16 x the products run in float16 (see `_dot`); launch.x_f16 converts x to
    float16 once before the launch (three small ops) instead of in every program at every K step.

    int4 weights (`kernels.int4.Int4Weight`, W4A16): the packed tiles are widened in registers
    (`_int4_tile`), so y equals F.linear(x, dequantize(weight), bias) up to rounding and summation
    order; a quarter of bf16's bytes plus 4 bytes per group. Kind "dot", every epilogue but rms_eps
    (folding a norm would re-quantize the weights); more than INT4_TILE_ROWS rows run as launches
    of that many (one tile of 256 rows spills registers).

    kind "dot": y.T = w @ x.T with `tl.dot` (token rows padded to 16; float32 inputs use IEEE
    products, not TF32). launch.split_k > 1 splits K over that many programs per column block, each
    writing a float32 partial (split_k * M * N * 4 bytes), summed in order by a second launch
    (`_split_sum_kernel`), or with launch.combine "kernel" by the last split of each column block
    to finish, in the same order (the same result bit for bit, one launch fewer; `kernels.counters`).
    fp8 weights split K (4) where N <= 8192, too few column blocks to fill the GPU, native weights
    at <= 16 rows with too few column blocks for a long K (`SPLIT_RULES`: TP-shard qkv GEMMs, the
    1B's down), with an RMSNorm epilogue too. kind "fma": broadcast multiply + sum in float32 (no
    tensor cores; block_n 16 and 8192 products per K step). pdl: launch as a
    programmatic dependent launch (`swiftspec.kernels.pdl`; Hopper GPUs): True / "early" (the dot
    kind then loads its first weight tile before waiting for the previous kernel) or "late" (the
    next kernel may launch once the K loop is done).

    epilogue.rms_eps: the input is RMSNorm(h) with h = x + residual (x alone without one) and the
    norm's weight folded into `weight` (W · diag(g): `fold_norm_weight`), so the add + norm before a GEMM
    costs no launch of its own: y = (weight @ h.T).T / rms(h) (+ bias). x and residual feed two dots
    straight from shared memory and h's squares are summed on the side, so the K loop stays a
    pipelined weight stream. epilogue.residual_out (M, K) receives h (needed with a residual). Equals
    gemv(add_rmsnorm(x, residual, g, rms_eps)[0], W) up to rounding order: float32 ~1e-7; bf16
    within the two-launch path's own error of the exact result. Kind "dot", weights in x's dtype.
    With split K each split sums its slice's squares beside its partial (split_k * M floats) and the
    split-sum launch scales the total by 1 / rms(h) and adds the bias.

    epilogue.act "swiglu" (kind "dot", no bias): weight is a SwiGLU MLP's fused gate|up (2F, K) and the
    result is silu(x @ gate.T) * (x @ up.T), (M, F): the activation in the GEMV's epilogue (or in
    the split-K sum) instead of a launch of its own, equal bit for bit to
    `silu_mul(gemv(x, weight, ...))` with the same other arguments.

    epilogue.rope (kind "dot", no act): weight is a fused qkv projection ((Hq + 2 Hkv) * D, K) and the
    epilogue (or the split-K sum) does `rope_kv`'s work: it returns the rotated q (M, Hq, D) and
    writes the rotated k and the v into rope.k_cache / rope.v_cache at rope.slots, equal bit for bit
    to `rope_kv(gemv(x, weight, bias, ...), ...)`: one launch fewer per layer.
    """
    int4 = isinstance(weight, Int4Weight)
    if x.dim() != 2 or len(weight.shape) != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"need x (M, K) and weight (N, K), got {tuple(x.shape)} and {tuple(weight.shape)}")
    epi, lc = epilogue or _NO_EPILOGUE, launch or _DEFAULT_LAUNCH
    rms_eps, residual, residual_out = epi.rms_eps, epi.residual, epi.residual_out
    act, rope = epi.act, epi.rope
    split_k, x_f16 = lc.split_k, lc.x_f16
    m, k = x.shape
    n = weight.shape[0]
    if int4 and m > INT4_TILE_ROWS:
        parts = []
        for r in range(0, m, INT4_TILE_ROWS):
            rows = slice(r, r + INT4_TILE_ROWS)
            part_rope = rope and replace(rope, cos=rope.cos[rows], sin=rope.sin[rows], slots=rope.slots[rows])
            parts.append(gemv(x[rows], weight, bias, kind=kind, epilogue=replace(epi, rope=part_rope), launch=launch,
                              pdl=pdl))
        return torch.cat(parts)
    if int4:
        check_group(k, weight.group_size)
        if kind != "dot" or scale is not None or rms_eps is not None or x_f16:
            raise ValueError("int4 weights need kind 'dot', no scale, no rms_eps and no x_f16")
        w4, weight = weight, weight.qweight
    elif lc.int4_x_ahead:
        raise ValueError("int4_x_ahead=True needs int4 weights")
    fp8 = weight.dtype == FP8
    if fp8 != (scale is not None):
        raise ValueError("fp8 weights need their scale (N,), and only fp8 weights take one")
    if fp8 and (scale.shape != (n,) or scale.dtype != torch.float32 or kind != "dot"):
        raise ValueError(f"fp8 weights: scale must be ({n},) float32 and kind 'dot'")
    limit = MAX_ROWS_DOT if kind == "dot" else MAX_ROWS
    if m > limit:
        raise ValueError(f"gemv kind {kind!r} takes at most {limit} rows, got {m}: use F.linear")
    if x.stride(-1) != 1 or weight.stride(-1) != 1:
        raise ValueError("x and weight need a contiguous last dim")
    if int4 and not (w4.scales.is_contiguous() and w4.zeros.is_contiguous() and w4.scales.shape == w4.zeros.shape):
        raise ValueError("int4 weights need contiguous scales and zeros of one shape")
    if bias is not None and bias.shape != (n,):
        raise ValueError(f"bias must be ({n},), got {tuple(bias.shape)}")
    if split_k is not None and (split_k < 1 or kind != "dot"):
        raise ValueError(f"split_k must be >= 1 and needs kind 'dot', got {split_k} with kind {kind!r}")
    rms = rms_eps is not None
    if rms:
        if kind != "dot" or fp8 or x_f16:
            raise ValueError("rms_eps needs kind 'dot' and weights in x's dtype")
        if (residual is None) != (residual_out is None):
            raise ValueError("residual and residual_out go together")
        for t in (residual, residual_out):
            if t is not None and (t.shape != x.shape or t.dtype != x.dtype or not t.is_contiguous()):
                raise ValueError(f"residual and residual_out must be contiguous {tuple(x.shape)} {x.dtype}")
    elif residual is not None or residual_out is not None:
        raise ValueError("residual needs rms_eps")
    swiglu = act is not None
    if act not in (None, "swiglu") or (swiglu and (kind != "dot" or bias is not None or n % 2)):
        raise ValueError(f"act must be None or 'swiglu' (kind 'dot', no bias, gate|up weights of an even row "
                         f"count), got {act!r} with kind {kind!r}, {n} rows")
    half, r = 1, rope
    if rope is not None:
        if swiglu or kind != "dot":
            raise ValueError("rope needs kind 'dot' and no act")
        half = check_rope(torch.empty((m, n), dtype=x.dtype, device="meta"), r.cos, r.sin, r.slots, r.k_cache,
                          r.v_cache, r.q_heads, r.kv_heads) // 2
        if r.cos.stride(0) != r.sin.stride(0):  # the epilogue steps through both with one row stride
            raise ValueError(f"rope: cos and sin need one row stride, got {r.cos.stride(0)} and {r.sin.stride(0)}")
    check_pdl(pdl, x.device)
    if rope is not None:
        y = torch.empty((m, rope.q_heads, 2 * half), dtype=x.dtype, device=x.device)
    else:
        y = torch.empty((m, n // 2 if swiglu else n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return y
    if kind == "dot":
        cfg = dot_config(m, n, k, 0.5 if int4 else weight.element_size(), x.element_size(), fp8=fp8, int4=int4,
                         pdl=pdl, residual=residual is not None, norm=rms, launch=lc)
        bm, bn, bk, split_k = cfg.block_m, cfg.block_n, cfg.block_k, cfg.split_k
        pairs = swiglu or rope is not None  # each program's bn weight rows are bn / 2 pairs of rows
        if int4 and bk < 128:  # `_int4_tile` dots BLOCK_K / 8 inputs at a time: the MMA's K is >= 16
            raise ValueError(f"int4 weights need block_k >= 128, got {bk}")
        upcast = _interpreted_bf16(x.dtype) and not fp8  # fp8 with bfloat16 x runs float16 products
        quant = (w4.scales, w4.zeros, w4.scales.stride(0)) if int4 else (x, x, 0)
        ieee = x.dtype == torch.float32 or upcast
        f16 = fp8 and x.dtype in (torch.bfloat16, torch.float16)
        x_f16 = f16 and x_f16
        if x_f16 and x.dtype != torch.float16:  # as `_dot` converts it, once for all programs
            x = x.float().clamp(-65504.0, 65504.0).to(torch.float16)
        blocks = triton.cdiv(n // 2, bn // 2) if pairs else triton.cdiv(n, bn)
        combine = lc.combine == "kernel" and split_k > 1
        counters = arrival_counters(lc.workspace, blocks, x.device) if combine else x  # x: unused
        part = y if split_k == 1 else torch.empty((split_k, m, n), dtype=torch.float32, device=x.device)
        sq = (torch.empty((split_k, blocks if combine else 1, m), dtype=torch.float32, device=x.device)
              if rms and split_k > 1 else x)
        res = residual if residual is not None else x
        # rope's pointers, or x where unused
        rp = (r.cos, r.sin, r.slots, r.k_cache, r.v_cache, r.cos.stride(0), r.k_cache.stride(0), r.k_cache.stride(1),
              r.v_cache.stride(0), r.v_cache.stride(1), r.q_heads, r.kv_heads) if r else (x,) * 5 + (0,) * 7
        _skinny_dot_kernel[(blocks, split_k)](
            x, weight, scale if fp8 else x, bias if bias is not None else x, y, part, sq, counters, res,
            residual_out if residual_out is not None else x, float(rms_eps or 0.0), m, n, k, x.stride(0),
            weight.stride(0), y.stride(0), res.stride(0), *rp, *quant, INT4=int4,
            GROUP=w4.group_size if int4 else 1, EVEN_K=int4 and k % bk == 0, PTX=int4 and _ptx(), X_AHEAD=int4 and int4_x_ahead_on(lc, bm),
            HAS_BIAS=bias is not None, HAS_SCALE=fp8, IEEE=ieee,
            UPCAST=upcast, F16=f16, X_F16=x_f16, SPLIT_K=split_k, RMS=rms, HAS_RES=residual is not None,
            SWIGLU=swiglu, ROPE=rope is not None, HALF=half, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, PDL=pdl_mode(pdl),
            PF_LINES=prefetch_lines(n, k, weight.element_size(), cfg, int4) if pdl_mode(pdl) == 4 else 0,
            COMBINE=combine, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **launch_options(pdl),
        )
        if split_k > 1 and not combine:
            total = m * n // 2 if pairs else m * n
            _split_sum_kernel[(triton.cdiv(total, 1024),)](
                part, y, bias if bias is not None else x, sq, float(rms_eps or 0.0), m, n, k, y.stride(0), *rp,
                SPLIT_K=split_k, HAS_BIAS=rms and bias is not None, RMS=rms, SWIGLU=swiglu, ROPE=rope is not None,
                HALF=half, BLOCK=1024, PDL=pdl_mode(pdl), **launch_options(pdl))
        return y
    if kind != "fma":
        raise ValueError(f"kind must be 'fma' or 'dot', got {kind!r}")
    bm, bn, bk = gemv_config(m, lc.block_n, lc.block_k)
    _gemv_kernel[(triton.cdiv(n, bn),)](
        x, weight, bias if bias is not None else weight, y, m, n, k, x.stride(0), weight.stride(0), y.stride(0),
        HAS_BIAS=bias is not None, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, PDL=pdl_mode(pdl),
        num_warps=lc.num_warps or 4,
        **({} if lc.num_stages is None else {"num_stages": lc.num_stages}),
        **launch_options(pdl),
    )
    return y


def fold_norm_weight(weight: torch.Tensor, norm_weight: torch.Tensor) -> torch.Tensor:
    """weight (N, K) · diag(norm_weight (K,)), computed in float32 and rounded once to weight's dtype:
    the GEMM weight that `gemv` with `Epilogue.rms_eps` takes in place of an RMSNorm's weight before it."""
    return (weight.float() * norm_weight.float()[None, :]).to(weight.dtype)


def gemv_ref(x: torch.Tensor, weight: torch.Tensor | Int4Weight, bias: torch.Tensor | None = None,
             scale: torch.Tensor | None = None) -> torch.Tensor:
    """Pure-torch reference: the model's `F.linear`; fp8 weights dequantized (weight * scale), int4
    weights by `int4.dequantize` to x's dtype."""
    if isinstance(weight, Int4Weight):
        return F.linear(x, dequantize(weight, x.dtype), bias)
    if scale is None:
        return F.linear(x, weight, bias)
    return F.linear(x, (weight.float() * scale[:, None]).to(x.dtype), bias)


def quantize_fp8(weight: torch.Tensor, amax: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """weight (N, K) -> (float8_e4m3fn (N, K), scale (N,) float32), per row: scale = amax / 448,
    so each row's largest |value| maps to e4m3's largest finite value (relative rounding error
    <= 2^-4 per element). Rows of zeros get scale 1. amax (N,): the rows' largest |value| when
    `weight` is a slice of longer rows (a row-parallel TP shard: the whole row's amax makes every
    shard's scale, and so the quantized model, independent of the TP size)."""
    if amax is None:
        amax = weight.float().abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    return (weight.float() / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale
