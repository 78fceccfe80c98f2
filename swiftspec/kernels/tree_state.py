"""The device loop's tree bookkeeping in four single-program Triton kernels.

`runtime/device_loop.py` keeps the draft tree in fixed-shape tensors; in torch one expansion's
bookkeeping is ~60 small kernels and one verify-and-update ~150, each a few µs of a CUDA graph
(more than the host loop's host time on small models). Each step here is one program of one CTA
that holds the tree's arrays in registers:

  expand_prep    pick the batch (the best open nodes: higher cum_logprob first, then smaller id),
                 give it draft slots, write the draft forward's inputs (pending row first)
  grow           write the children of the batch from the draft's top-k
  verify_prep    pick the bs nodes to verify and write the target forward's inputs
  verify_finish  accept, append the produced tokens (EOS and budget on the device), write the KV
                 moves of both sides and start a fresh tree at the bonus token

The torch implementation in `device_loop.DeviceLoop` is the reference; tests run both on random
trees and compare every state tensor. "Best m of a set" is a rank count: node i's rank is the
number of set members before it in (key desc, id asc) order, its place in the batch the number
of members with a smaller id, so no sort is needed. Stores that overwrite what other threads still
read come after a `tl.debug_barrier()`.

State layout (`DeviceLoop`): NODES (5, N+1) int64 rows tok, par, dep, rank, slot; CUM (N+1,)
float64; ANC (N+1, S+1) uint8; scalars as 0-d int64 tensors.
"""

from __future__ import annotations

import triton
import triton.language as tl

TOK, PAR, DEP, RANK, SLOT = (tl.constexpr(i) for i in range(5))  # rows of NODES


@triton.jit
def _keys(NODES, CUM, idx, N, count, MAX_DEPTH, MODE: tl.constexpr):
    """(member, key) of nodes idx: MODE 0, members are the open nodes (unexpanded, below
    MAX_DEPTH when > 0), 1: all nodes; key = cum_logprob held above -inf for members, -inf else."""
    inside = idx < N
    cum = tl.load(CUM + idx, mask=inside, other=0.0)
    ok = inside & (idx < count)
    if MODE == 0:
        slot = tl.load(NODES + SLOT * (N + 1) + idx, mask=inside, other=0)
        dep = tl.load(NODES + DEP * (N + 1) + idx, mask=inside, other=0)
        ok = ok & (slot < 0) & ((MAX_DEPTH == 0) | (dep < MAX_DEPTH))
    floor = tl.full(cum.shape, -1e300, tl.float64)
    return ok, tl.where(ok, tl.maximum(cum, floor), float("-inf"))


@triton.jit
def _rank_before(key_i, i, NODES, CUM, N, count, MAX_DEPTH, MODE: tl.constexpr, BLOCK_J: tl.constexpr):
    """rank of each i: members j with key_j > key_i, or equal and j < i. MODE 0: members are the
    open nodes (expansion), 1: all nodes (selection)."""
    rank = tl.zeros(key_i.shape, tl.int32)
    for j0 in range(0, N, BLOCK_J):
        j = j0 + tl.arange(0, BLOCK_J)
        ok_j, key_j = _keys(NODES, CUM, j, N, count, MAX_DEPTH, MODE)
        before = (key_j[None, :] > key_i[:, None]) | ((key_j[None, :] == key_i[:, None]) & (j[None, :] < i[:, None]))
        rank += tl.sum((before & ok_j[None, :]).to(tl.int32), axis=1)
    return rank


@triton.jit
def _best(NODES, CUM, N, count, MAX_DEPTH, M, MODE: tl.constexpr, OUT_P2: tl.constexpr, BLOCK_N: tl.constexpr,
          BLOCK_J: tl.constexpr):
    """The best M members (see `_rank_before`) in ascending id order, N for none: (OUT_P2,), and
    how many there are."""
    i = tl.arange(0, BLOCK_N)
    ok_i, key_i = _keys(NODES, CUM, i, N, count, MAX_DEPTH, MODE)
    rank = _rank_before(key_i, i, NODES, CUM, N, count, MAX_DEPTH, MODE, BLOCK_J)
    chosen = ok_i & (rank < M)
    place = tl.cumsum(chosen.to(tl.int32), axis=0) - 1
    p = tl.arange(0, OUT_P2)
    hit = chosen[None, :] & (place[None, :] == p[:, None])
    n = tl.sum(chosen.to(tl.int32), axis=0)
    out = tl.sum(tl.where(hit, i[None, :], 0), axis=1).to(tl.int64)
    return tl.where(p < n, out, N), n


@triton.jit
def expand_prep_kernel(NODES, CUM, ANC, COUNT, NSLOTS, PREFIX, PEND_N, PEND_TOK, DONE, CONST_BATCH,
                       BATCH, TOK_IN, POS_IN, SLOT_IN, MASK_IN, BASE, FWD,
                       N, S, SCRATCH, MAX_DEPTH,
                       ROWS: tl.constexpr, ROWS_P2: tl.constexpr, PENDING: tl.constexpr, DYNAMIC: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_S: tl.constexpr):
    """One expansion's batch, slots and draft inputs (rows: pending row if PENDING, then ROWS)."""
    count = tl.load(COUNT)
    nslots = tl.load(NSLOTS)
    prefix = tl.load(PREFIX)
    p = tl.arange(0, ROWS_P2)
    in_rows = p < ROWS
    if DYNAMIC:
        batch, nb = _best(NODES, CUM, N, count, MAX_DEPTH, ROWS, 0, ROWS_P2, BLOCK_N, BLOCK_J)
    else:
        batch = tl.load(CONST_BATCH + p, mask=in_rows, other=N)
        nb = tl.sum((batch < N).to(tl.int32), axis=0)
    valid = in_rows & (batch < N)
    new_slot = nslots + p
    if PENDING:
        pend_n = tl.load(PEND_N)
        pend_tok = tl.load(PEND_TOK)
    else:
        pend_n = prefix * 0
        pend_tok = prefix * 0
    base = prefix + pend_n
    btok = tl.load(NODES + TOK * (N + 1) + batch, mask=valid, other=0)
    bdep = tl.load(NODES + DEP * (N + 1) + batch, mask=valid, other=0)
    c = tl.arange(0, BLOCK_S)
    in_s = c < S
    anc = tl.load(ANC + batch[:, None] * (S + 1) + c[None, :], mask=valid[:, None] & in_s[None, :], other=0)
    mask = (anc != 0) | (c[None, :] == new_slot[:, None])
    mask = tl.where(valid[:, None], mask, c[None, :] == 0)
    tl.debug_barrier()  # every thread has read the counters and the batch's rows
    off: tl.constexpr = 1 if PENDING else 0
    tl.store(BATCH + p, batch, mask=in_rows)
    tl.store(TOK_IN + off + p, tl.where(valid, btok, 0), mask=in_rows)
    tl.store(POS_IN + off + p, tl.where(valid, base + bdep, 0), mask=in_rows)
    tl.store(SLOT_IN + off + p, tl.where(valid, base + new_slot, SCRATCH), mask=in_rows)
    tl.store(MASK_IN + (off + p)[:, None] * S + c[None, :], mask.to(tl.int8), mask=in_rows[:, None] & in_s[None, :])
    tl.store(NODES + SLOT * (N + 1) + batch, new_slot, mask=valid)
    tl.store(ANC + batch * (S + 1) + new_slot, tl.full([ROWS_P2], 1, tl.int8), mask=valid)
    tl.store(NSLOTS, nslots + nb)
    tl.store(BASE, base)
    tl.store(FWD, nb.to(tl.int64))
    tl.store(FWD + 1, (nb + pend_n).to(tl.int64))
    if PENDING:
        has = pend_n > 0
        tl.store(TOK_IN, tl.where(has, pend_tok, 0))
        tl.store(POS_IN, tl.where(has, prefix, 0))
        tl.store(SLOT_IN, tl.where(has, prefix, SCRATCH))
        tl.store(MASK_IN + c, ((c == 0) & (pend_n == 0)).to(tl.int8), mask=in_s)
        live = tl.load(DONE) == 0  # after the stop the caller's draft state stays as it was
        tl.store(PREFIX, tl.where(live, base, prefix))
        tl.store(PEND_N, tl.where(live, pend_n * 0, pend_n))


@triton.jit
def grow_kernel(NODES, CUM, ANC, COUNT, BATCH, VALUES, INDICES, CHILDREN, RANK_LP, N, S, COUNT_AFTER,
                ROWS: tl.constexpr, ROWS_P2: tl.constexpr, K: tl.constexpr, K_P2: tl.constexpr,
                STATIC: tl.constexpr, SYNTH: tl.constexpr, BLOCK_S: tl.constexpr):
    """The children of the batch: node fields, cum_logprob and ancestor rows (copied from the parent)."""
    count = tl.load(COUNT)
    p = tl.arange(0, ROWS_P2)
    r = tl.arange(0, K_P2)
    batch = tl.load(BATCH + p, mask=p < ROWS, other=N)
    valid = (p < ROWS) & (batch < N)
    nb = tl.sum(valid.to(tl.int32), axis=0)
    both = valid[:, None] & (r[None, :] < K)
    if STATIC:
        child = tl.load(CHILDREN + p[:, None] * K + r[None, :], mask=both, other=N)
    else:
        child = count + p[:, None] * K + r[None, :]
    ok = both & (child < N)
    idx = tl.load(INDICES + p[:, None] * K + r[None, :], mask=ok, other=0)
    pdep = tl.load(NODES + DEP * (N + 1) + batch, mask=valid, other=0)
    pcum = tl.load(CUM + batch, mask=valid, other=0.0)
    if SYNTH:
        lp = tl.load(RANK_LP + r, mask=r < K, other=0.0)[None, :]
    else:
        lp = tl.load(VALUES + p[:, None] * K + r[None, :], mask=ok, other=0.0).to(tl.float64)
    c = tl.arange(0, BLOCK_S)
    in_s = c < S
    anc = tl.load(ANC + batch[:, None] * (S + 1) + c[None, :], mask=valid[:, None] & in_s[None, :], other=0)
    tl.debug_barrier()
    row = N + 1
    tl.store(NODES + TOK * row + child, idx, mask=ok)
    tl.store(NODES + PAR * row + child, batch[:, None] + r[None, :] * 0, mask=ok)
    tl.store(NODES + DEP * row + child, pdep[:, None] + 1 + r[None, :] * 0, mask=ok)
    tl.store(NODES + RANK * row + child, (r[None, :] + p[:, None] * 0).to(tl.int64), mask=ok)
    tl.store(NODES + SLOT * row + child, tl.full([ROWS_P2, K_P2], -1, tl.int64), mask=ok)
    tl.store(CUM + child, pcum[:, None] + lp, mask=ok)
    for rr in tl.static_range(K):
        if STATIC:
            ch = tl.load(CHILDREN + p * K + rr, mask=valid, other=N)
        else:
            ch = count + p * K + rr
        okr = valid & (ch < N)
        tl.store(ANC + ch[:, None] * (S + 1) + c[None, :], anc, mask=okr[:, None] & in_s[None, :])
    if STATIC:
        tl.store(COUNT, COUNT_AFTER + count * 0)
    else:
        tl.store(COUNT, count + nb * K)


@triton.jit
def verify_prep_kernel(NODES, CUM, ANC, COUNT, TPREFIX, STREAM, POS, SEL, TOK_IN, POS_IN, SLOT_IN, MASK_IN, U,
                       VSTATS, N, S, SCRATCH, STREAM_LEN,
                       BS: tl.constexpr, BS_P2: tl.constexpr, DYNAMIC: tl.constexpr, SAMPLED: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_J: tl.constexpr):
    """The bs nodes to verify (ascending ids, N for none) and the target forward's inputs; U: the
    uniform of each row's output position (sampled)."""
    count = tl.load(COUNT)
    tp = tl.load(TPREFIX)
    q = tl.arange(0, BS_P2)
    if DYNAMIC:
        sel, ns = _best(NODES, CUM, N, count, 0, BS, 1, BS_P2, BLOCK_N, BLOCK_J)
    else:
        sel = tl.where(q < count, q, N).to(tl.int64)
        ns = tl.sum((q < count).to(tl.int32), axis=0)
    vs = (q < BS) & (sel < N)
    tok = tl.load(NODES + TOK * (N + 1) + sel, mask=vs, other=0)
    dep = tl.load(NODES + DEP * (N + 1) + sel, mask=vs, other=0)
    sslot = tl.load(NODES + SLOT * (N + 1) + sel, mask=vs, other=-1)
    both = vs[:, None] & vs[None, :] & (sslot[None, :] >= 0)
    a = tl.load(ANC + sel[:, None] * (S + 1) + tl.maximum(sslot, 0)[None, :], mask=both, other=0)
    m = ((q[:, None] == q[None, :]) | (a != 0)) & vs[:, None] & vs[None, :]
    m = m | ((~vs)[:, None] & (q[None, :] == 0))
    tl.store(SEL + q, sel, mask=q < BS)
    tl.store(TOK_IN + q, tl.where(vs, tok, 0), mask=q < BS)
    tl.store(POS_IN + q, tl.where(vs, tp + dep, 0), mask=q < BS)
    tl.store(SLOT_IN + q, tl.where(vs, tp + q, SCRATCH), mask=q < BS)
    tl.store(MASK_IN + q[:, None] * BS + q[None, :], m.to(tl.int8), mask=(q[:, None] < BS) & (q[None, :] < BS))
    if SAMPLED:
        pos = tl.load(POS)
        u = tl.load(STREAM + tl.minimum(pos + dep, STREAM_LEN - 1), mask=q < BS, other=0.0)
        tl.store(U + q, u, mask=q < BS)
    tl.store(VSTATS, ns.to(tl.int64))
    tl.store(VSTATS + 1, count)


@triton.jit
def verify_finish_kernel(NODES, CUM, ANC, COUNT, NSLOTS, SEL, MASK_IN, CHOICE, STREAM, POS, TPREFIX, DPREFIX,
                         PEND_N, PEND_TOK, OUT, NOUT, DONE, ITERS, STATS, VSTATS, FWD, EOS, T_MOVE, D_MOVE,
                         N, S, SCRATCH_T, SCRATCH_D, STREAM_LEN, MAX_NEW, MAX_ITERS, OUT_LEN, NCOLS,
                         BS: tl.constexpr, BS_P2: tl.constexpr, SYNTH: tl.constexpr, DRAFT: tl.constexpr,
                         NEOS: tl.constexpr, NFWD: tl.constexpr, FWD_P2: tl.constexpr, CAND_P2: tl.constexpr,
                         BLOCK_R: tl.constexpr):
    """Accept, emit, KV moves of both sides (T_MOVE / D_MOVE: (2, BS) src then dst), fresh tree."""
    q = tl.arange(0, BS_P2)
    inq = q < BS
    sel = tl.load(SEL + q, mask=inq, other=N)
    vs = inq & (sel < N)
    row = N + 1
    tok = tl.load(NODES + TOK * row + sel, mask=vs, other=0)
    par = tl.load(NODES + PAR * row + sel, mask=vs, other=-1)
    dep = tl.load(NODES + DEP * row + sel, mask=vs, other=0)
    rnk = tl.load(NODES + RANK * row + sel, mask=vs, other=0)
    slot = tl.load(NODES + SLOT * row + sel, mask=vs, other=-1)
    choice = tl.load(CHOICE + q, mask=inq, other=0)
    pos = tl.load(POS)
    # the parent's row: sel is ascending and holds every selected node's parent
    prow = tl.sum(((sel[None, :] < par[:, None]) & vs[None, :]).to(tl.int32), axis=1)
    if SYNTH:
        want = tl.load(STREAM + tl.minimum(tl.maximum(pos + dep - 1, 0), STREAM_LEN - 1), mask=vs, other=-1)
        ok = rnk == want
    else:
        ok = tok == tl.load(CHOICE + prow, mask=vs, other=-1)
    ok = vs & ((q == 0) | ok)
    m = tl.load(MASK_IN + q[:, None] * BS + q[None, :], mask=inq[:, None] & inq[None, :], other=0) != 0
    acc = vs & (tl.sum((m & ~ok[None, :]).to(tl.int32), axis=1) == 0)
    k = tl.sum(acc.to(tl.int32), axis=0)
    deepest = tl.max(tl.where(acc, dep, -1), axis=0)
    is_last = acc & (dep == deepest)
    last = tl.sum(tl.where(is_last, sel, 0), axis=0)
    last_slot = tl.sum(tl.where(is_last, slot, 0), axis=0)
    last_tok = tl.sum(tl.where(is_last, tok, 0), axis=0)
    fallback = tl.sum(tl.where(is_last, choice, 0), axis=0)
    count = tl.load(COUNT)
    if SYNTH:  # synthetic.resolve_bonus over the whole tree
        want_b = tl.load(STREAM + tl.minimum(pos + deepest, STREAM_LEN - 1))
        hit_n = tl.zeros([BLOCK_R], tl.int32)
        hit_tok = tl.zeros([BLOCK_R], tl.int64)
        taken_n = tl.zeros([BLOCK_R], tl.int32)
        cand = tl.arange(0, CAND_P2)
        used = tl.zeros([CAND_P2], tl.int32)
        for j0 in range(0, N, BLOCK_R):
            j = j0 + tl.arange(0, BLOCK_R)
            in_j = (j < N) & (j < count)
            pj = tl.load(NODES + PAR * row + j, mask=in_j, other=-1)
            rj = tl.load(NODES + RANK * row + j, mask=in_j, other=-1)
            tj = tl.load(NODES + TOK * row + j, mask=in_j, other=-1)
            kid = in_j & (pj == last)
            hit = kid & (rj == want_b)
            hit_n += hit.to(tl.int32)
            hit_tok += tl.where(hit, tj, 0)
            taken_n += (kid & (tj == fallback)).to(tl.int32)
            used += tl.sum((kid[None, :] & (tj[None, :] == cand[:, None])).to(tl.int32), axis=1)
        smallest = tl.min(tl.where(used == 0, cand, CAND_P2), axis=0)
        bonus = tl.where(tl.sum(hit_n, axis=0) > 0, tl.sum(hit_tok, axis=0),
                         tl.where(tl.sum(taken_n, axis=0) > 0, smallest.to(tl.int64), fallback))
    else:
        bonus = fallback
    # the path in order: place of each accepted row among the accepted rows
    place = tl.cumsum(acc.to(tl.int32), axis=0) - 1
    at = acc[None, :] & (place[None, :] == q[:, None])  # (p, i): row i is the path's p-th node
    path_row = tl.sum(tl.where(at, q[None, :], 0), axis=1)
    path_slot = tl.sum(tl.where(at, slot[None, :], 0), axis=1)
    nxt = acc[None, :] & (place[None, :] == q[:, None] + 1)
    new = tl.where(q == k - 1, bonus, tl.sum(tl.where(nxt, tok[None, :], 0), axis=1))
    on_path = q < k
    done = tl.load(DONE) != 0
    live = (~done).to(tl.int32)
    nout = tl.load(NOUT)
    stop = k * 0
    take = k
    if NEOS > 0:
        first = BS_P2 + k * 0
        for e in tl.static_range(NEOS):
            ev = tl.load(EOS + e)
            hit_e = on_path & (new == ev)
            first = tl.minimum(first, tl.min(tl.where(hit_e, q, BS_P2), axis=0))
        stop = (first < BS_P2).to(tl.int32)
        take = tl.where(stop > 0, first + 1, k)
    take = tl.minimum(take, MAX_NEW - nout) * live
    tp = tl.load(TPREFIX)
    iters = tl.load(ITERS)
    ns = tl.load(VSTATS)  # verify_prep's (selected, tree size)
    tn = tl.load(VSTATS + 1)
    if DRAFT:
        dp = tl.load(DPREFIX)
        old_pend_n = tl.load(PEND_N)
        old_pend_tok = tl.load(PEND_TOK)
        expd = on_path & (path_slot >= 0)
        n_exp = tl.sum(expd.to(tl.int32), axis=0)
    tl.debug_barrier()  # everything read: now write
    tl.store(OUT + tl.where(q < take, nout + q, OUT_LEN - 1), new, mask=inq)
    tl.store(NOUT, nout + take)
    tl.store(DONE, (done | ((live > 0) & ((stop > 0) | (nout + take >= MAX_NEW)))).to(tl.int8))
    it = tl.where(live > 0, iters, MAX_ITERS)
    tl.store(STATS + it * NCOLS, k.to(tl.int64))
    tl.store(STATS + it * NCOLS + 1, ns)
    tl.store(STATS + it * NCOLS + 2, tn)
    if NFWD > 0:
        f = tl.arange(0, FWD_P2)
        fv = tl.load(FWD + f, mask=f < 2 * NFWD, other=0)
        tl.store(STATS + it * NCOLS + 3 + f, fv, mask=f < 2 * NFWD)
    tl.store(ITERS, iters + live)
    tl.store(POS, pos + k * live)
    tl.store(TPREFIX, tp + k * live)
    tl.store(T_MOVE + q, tl.where(on_path, tp + path_row, SCRATCH_T), mask=inq)
    tl.store(T_MOVE + BS + q, tl.where(on_path, tp + q, SCRATCH_T), mask=inq)
    if DRAFT:
        tl.store(D_MOVE + q, tl.where(expd, dp + path_slot, SCRATCH_D), mask=inq)
        tl.store(D_MOVE + BS + q, tl.where(expd, dp + q, SCRATCH_D), mask=inq)
        tl.store(DPREFIX, dp + n_exp * live)
        tl.store(PEND_N, tl.where(live > 0, (last_slot < 0).to(tl.int64), old_pend_n))
        tl.store(PEND_TOK, tl.where(live > 0, last_tok, old_pend_tok))
        # a fresh tree at the bonus token
        for j0 in range(0, N + 1, BLOCK_R):
            j = j0 + tl.arange(0, BLOCK_R)
            in_j = j <= N
            tl.store(NODES + TOK * row + j, tl.where(j == 0, bonus, 0), mask=in_j)
            tl.store(NODES + PAR * row + j, tl.full([BLOCK_R], -1, tl.int64), mask=in_j)
            tl.store(NODES + DEP * row + j, tl.zeros([BLOCK_R], tl.int64), mask=in_j)
            tl.store(NODES + RANK * row + j, tl.zeros([BLOCK_R], tl.int64), mask=in_j)
            tl.store(NODES + SLOT * row + j, tl.full([BLOCK_R], -1, tl.int64), mask=in_j)
            tl.store(CUM + j, tl.zeros([BLOCK_R], tl.float64), mask=in_j)
        for j0 in range(0, (N + 1) * (S + 1), BLOCK_R):
            j = j0 + tl.arange(0, BLOCK_R)
            tl.store(ANC + j, tl.zeros([BLOCK_R], tl.int8), mask=j < (N + 1) * (S + 1))
        tl.store(COUNT, count * 0 + 1)
        tl.store(NSLOTS, count * 0)
    else:
        tl.store(NODES + TOK * row, bonus)


def p2(x: int) -> int:
    """The smallest power of two >= max(x, 2) (Triton block sizes)."""
    return max(2, triton.next_power_of_2(int(x)))
