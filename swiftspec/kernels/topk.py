"""Tree growth in Triton: log-softmax + top-k over the vocabulary, per row, in two launches.

`DraftTree.grow` needs, for each expanded node, the k most probable next tokens and their
log-probabilities. In torch that is `torch.topk(torch.log_softmax(logits.float(), -1), k)`: a
full (T, V) float32 log-softmax written and read back, then a radix select: several launches and
passes over the logits where the bytes floor is one read of them (0.5 MB per row at vocab 128256),
a sizeable part of a small draft's step (docs/decisions.md).

Design: stage 1, grid (T, ceil(V / CHUNK)): each program reads one CHUNK of one row once and
writes that chunk's max, its sum of exp(x - max), and its own top k (k rounds of "take the max,
lowest index first, then mask it out", all in registers). Stage 2, one program per row: the
log-sum-exp merge of the chunks gives log Z, and the same k rounds over the chunks' candidates
(every global top-k entry is in its chunk's top k) give the answer, values minus log Z.
Ties: equal values come out lowest index first (`torch.topk` leaves their order unspecified).
A row whose every logit is -inf gives NaN values, as torch's log_softmax does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from swiftspec.kernels.reference import logsoftmax_topk_ref  # noqa: F401  (benchmarks import it from here)

if TYPE_CHECKING:
    import numpy as np

MAX_K = 64  # k rounds run unrolled in both stages


@triton.jit
def _chunk_kernel(L, PM, PS, PV, PI, V, stride_l, NCHUNK, CHUNK: tl.constexpr, K: tl.constexpr):
    """Program (row, chunk): max, sum of exp(x - max) and top K (value, index) of one chunk."""
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    offs = c * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(L + row * stride_l + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
    m = tl.max(x, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)  # an all -inf chunk: sum 0, not NaN
    part = row * NCHUNK + c
    tl.store(PM + part, m)
    tl.store(PS + part, tl.sum(tl.exp(x - m_safe), 0))
    # `free`: entries not taken yet, so a chunk with fewer than K finite logits (or fewer than K
    # entries: the tail) yields each index once, then padding (INT_MAX, -inf) that sorts last.
    free = offs < V
    for i in tl.static_range(K):
        v = tl.max(tl.where(free, x, float("-inf")), 0)
        idx = tl.min(tl.where(free & (x == v), offs, 2147483647), 0)  # lowest index among the maxima
        tl.store(PV + part * K + i, v)
        tl.store(PI + part * K + i, idx)
        free = free & (offs != idx)


@triton.jit
def _merge_kernel(PM, PS, PV, PI, OUT_V, OUT_I, NCHUNK, CHUNKS_P2: tl.constexpr, K: tl.constexpr,
                  K_P2: tl.constexpr):
    """Program row: log Z from the chunks' (max, sum), then the top K of their candidates."""
    row = tl.program_id(0).to(tl.int64)
    cs = tl.arange(0, CHUNKS_P2)
    ok_c = cs < NCHUNK
    m = tl.load(PM + row * NCHUNK + cs, mask=ok_c, other=float("-inf"))
    s = tl.load(PS + row * NCHUNK + cs, mask=ok_c, other=0.0)
    mx = tl.max(m, 0)
    mx_safe = tl.where(mx == float("-inf"), 0.0, mx)
    log_z = mx_safe + tl.log(tl.sum(s * tl.exp(m - mx_safe), 0))  # log(0) = -inf: NaN values below
    ks = tl.arange(0, K_P2)
    cand = (row * NCHUNK + cs)[:, None] * K + ks[None, :]  # (CHUNKS_P2, K_P2)
    ok = ok_c[:, None] & (ks < K)[None, :]
    v = tl.load(PV + cand, mask=ok, other=float("-inf"))
    idx = tl.load(PI + cand, mask=ok, other=2147483647)
    free = ok
    for i in tl.static_range(K):
        best = tl.max(tl.max(tl.where(free, v, float("-inf")), 1), 0)
        at = tl.min(tl.min(tl.where(free & (v == best), idx, 2147483647), 1), 0)
        tl.store(OUT_V + row * K + i, best - log_z)
        tl.store(OUT_I + row * K + i, at.to(tl.int64))
        free = free & (idx != at)


def logsoftmax_topk(logits: torch.Tensor, k: int, *, chunk: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, indices) of the k largest log-probabilities of each row, largest first.

    logits: (T, V) float32/bfloat16/float16, last dim contiguous; 1 <= k <= min(V, MAX_K).
    Returns values (T, k) float32 = log_softmax(logits.float())[row, indices] and indices (T, k)
    int64, as `logsoftmax_topk_ref` (ties lowest index first). Two launches, no host sync.
    chunk: vocabulary entries per stage-1 program (a power of two >= k).
    """
    return unpack_topk(logsoftmax_topk_packed(logits, k, chunk=chunk), logits.shape[0], k)


def logsoftmax_topk_packed(logits: torch.Tensor, k: int, *, chunk: int = 4096) -> torch.Tensor:
    """`logsoftmax_topk`'s answer in one int32 buffer (3 T k,): the indices as int64 (2 T k words),
    then the values as float32 (T k words); `unpack_topk` gives the two back. One buffer is one
    device-to-host copy and one sync for tree growth instead of two."""
    if logits.dim() != 2 or logits.stride(-1) != 1:
        raise ValueError(f"logits must be (T, V) with a contiguous last dim, got {tuple(logits.shape)}")
    t, v = logits.shape
    if not 1 <= k <= min(v, MAX_K):
        raise ValueError(f"k must be in 1..{min(v, MAX_K)} (vocab {v}, MAX_K {MAX_K}), got {k}")
    if chunk & (chunk - 1) or chunk < k:
        raise ValueError(f"chunk must be a power of two >= k, got {chunk}")
    dev = logits.device
    packed = torch.empty(3 * t * k, dtype=torch.int32, device=dev)
    if t == 0:
        return packed
    values, indices = unpack_topk(packed, t, k)
    chunk = max(triton.next_power_of_2(k), min(chunk, triton.next_power_of_2(v)))
    n = triton.cdiv(v, chunk)
    # the four partials in one allocation (a few µs of host time each): max, sum, top-k values,
    # top-k indices (int32 words)
    part = torch.empty(t * n * (2 + 2 * k), dtype=torch.float32, device=dev)
    pm, ps = part[: t * n], part[t * n : 2 * t * n]
    pv, pi = part[2 * t * n : (2 + k) * t * n], part[(2 + k) * t * n :].view(torch.int32)
    _chunk_kernel[(t, n)](logits, pm, ps, pv, pi, v, logits.stride(0), n, CHUNK=chunk, K=k,
                          num_warps=8 if chunk >= 4096 else 4)  # fmt: skip
    _merge_kernel[(t,)](pm, ps, pv, pi, values, indices, n, CHUNKS_P2=triton.next_power_of_2(n), K=k,
                        K_P2=triton.next_power_of_2(k), num_warps=4)  # fmt: skip
    return packed


def unpack_topk(packed: torch.Tensor | np.ndarray, t: int, k: int) -> tuple:
    """(values (t, k) float32, indices (t, k) int64) views of a `logsoftmax_topk_packed` buffer,
    a torch tensor (on any device) or its numpy copy on the host."""
    if isinstance(packed, torch.Tensor):
        f32, i64 = torch.float32, torch.int64
    else:
        f32, i64 = "float32", "int64"
    return packed[2 * t * k :].view(f32).reshape(t, k), packed[: 2 * t * k].view(i64).reshape(t, k)

