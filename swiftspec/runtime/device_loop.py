"""Device-resident speculation: a whole decoding iteration as fixed-shape tensor work.

The host loop (`generate.generate` with `DraftTree`) keeps the tree in Python lists and reads the
draft's top-k and the target's verdict back every step: one device sync per draft forward and per
verify, and 0.6-1.4 ms of host work per iteration on the H200 (docs/performance.md). Here the
same iteration runs on device tensors of fixed shapes, so on CUDA it is captured once per policy
and replayed: the host launches two graphs per iteration (the draft round; verify and update) and
reads (done, tokens so far) back with one small asynchronous copy, one iteration late, or at once
when the token budget is within one iteration (the stop conditions, EOS and the budget, are
checked on the device, and an iteration launched after the stop changes nothing the caller sees).
On CUDA the bookkeeping between the forwards is four Triton kernels (`kernels/tree_state.py`);
the torch code here is their reference and what runs on a CPU, eagerly, so the lossless tests
cover this path.

The tree is the one `tree.DraftTree` grows, node for node (same creation order, same ties: the
higher cum_logprob first, then the smaller id), held in arrays of a fixed capacity `N` plus one
trash entry at index N, where padded rows write:

    tok, par, dep, rank (N+1,) int64   token, parent (-1: root), depth, draft rank among siblings
    cum (N+1,) float64                 cumulative draft log-probability (as the host's floats)
    slot (N+1,) int64                  draft tree-region slot, -1 while unexpanded
    anc (N+1, S+1) bool                anc[n, s]: the node in draft slot s is n or an ancestor of it
    count, nslots () int64             nodes, expanded nodes

`anc` gives both masks without walking the tree: a draft forward's row for node n is anc[n, :S],
and the verify mask of the selected nodes is anc[sel_i, slot[sel_j]] (an unexpanded node has no
descendants, so it is only its own ancestor).

One round of expansions (`LoopPlan.expansions`): a fresh tree's first forward carries the pending
token (an accepted leaf the draft never forwarded: at most one, the last node of a path) in row 0,
padding when there is none; then the batch rows. Padding rows write the cache's scratch slot and
attend to tree slot 0, as in `graphs.py`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from swiftspec.kernels import tree_state as ts
from swiftspec.runtime.capture import capture_graphs
from swiftspec.runtime.decoder import ModelRunner
from swiftspec.runtime.tree import DraftTree, top_logprobs
from swiftspec.runtime.verify import sample_by_inverse_cdf
from swiftspec.spec import SamplingParams, TreePolicy

VERIFY_KINDS = ("greedy", "sampled", "synthetic")


@dataclass(frozen=True)
class Expansion:
    """One draft forward of a round.

    rows: batch nodes forwarded (padding included); pending: row 0 carries the pending token
    (the first forward of a fresh or re-rooted tree); k: children per node. batch / children:
    a static topology's node ids (rows,) and child ids (rows, k) (N: none), known before the
    round; None: chosen on the device by cum_logprob (dynamic trees)."""

    rows: int
    pending: bool
    k: int
    batch: tuple[int, ...] | None = None
    children: tuple[tuple[int, ...], ...] | None = None
    count_after: int = 0  # static: nodes once this level is grown


@dataclass(frozen=True)
class LoopPlan:
    """The fixed shapes of one policy's device loop.

    nodes: tree capacity N; slots: draft tree-region slots S; expansions: the forwards of one
    round; keep: re-root at the bonus token and keep its subtree (async, serial keep_subtree),
    else every round starts a fresh tree."""

    policy: TreePolicy
    nodes: int
    slots: int
    expansions: tuple[Expansion, ...]
    keep: bool

    @classmethod
    def build(cls, policy: TreePolicy, vocab: int, *, keep: bool = False, rounds: int | None = None) -> LoopPlan:
        """The plan of `policy` for a draft of `vocab` ids. rounds: draft forwards per round
        (default: d, or a static topology's levels); keep: see the class docstring."""
        if policy.kind == "static":
            return cls._static(policy, vocab)
        w, rounds = policy.w, policy.d if rounds is None else rounds
        k = min(w, vocab)
        exps = []
        for e in range(rounds):
            if e == 0 and not keep:  # a fresh tree: its root alone
                exps.append(Expansion(rows=1, pending=True, k=k, batch=(0,)))
            else:
                exps.append(Expansion(rows=w, pending=e == 0, k=k))
        grown = sum(x.rows * x.k for x in exps)
        nodes = 1 + grown + (policy.keep_limit if keep else 0)
        slots = sum(x.rows for x in exps) + (policy.keep_limit if keep else 0)
        return cls(policy, max(nodes, policy.bs), max(slots, 1), tuple(exps), keep)

    @classmethod
    def _static(cls, policy: TreePolicy, vocab: int) -> LoopPlan:
        """A static topology's round, level by level, with the node ids `DraftTree` gives."""
        topo = policy.topology or (-1,)
        kids = [[i for i, p in enumerate(topo) if p == t] for t in range(len(topo))]
        tree = DraftTree.fresh(0, policy)
        exps = []
        while batch := tree.next_batch():
            k = min(max(len(kids[tree.topo[n]]) for n in batch), vocab)
            first = len(tree)
            children, nid = [], first
            for n in batch:
                c = min(len(kids[tree.topo[n]]), k)
                children.append(tuple(range(nid, nid + c)) + (-1,) * (k - c))
                nid += c
            fake = torch.zeros(len(batch), max(k, 1))
            tree.draft_inputs(batch)
            tree.grow(batch, fake, top=lambda lg, kk: ([[0.0] * kk] * lg.shape[0], [list(range(kk))] * lg.shape[0]))
            exps.append(Expansion(rows=len(batch), pending=not exps, k=k, batch=tuple(batch),
                                  children=tuple(children), count_after=len(tree)))
        n = len(topo)
        exps = [Expansion(x.rows, x.pending, x.k, x.batch, tuple(tuple(c if c >= 0 else n for c in row)
                                                                  for row in x.children), x.count_after)
                for x in exps]
        return cls(policy, n, max(tree.num_slots, 1), tuple(exps), False)


@dataclass(frozen=True)
class LoopConfig:
    """What the loop decodes: the plan, how it verifies and when it stops.

    verify: "greedy", "sampled" (lossless sampling, `verify.SamplingVerifier`'s draws) or
    "synthetic" (a replayed rank path, `synthetic.SyntheticVerifier`). max_new_tokens, eos_ids:
    the stop conditions. rank_logprobs: synthetic tree shape (`DraftTree.rank_logprobs`)."""

    plan: LoopPlan | None  # None: autoregressive (no draft)
    verify: str
    max_new_tokens: int
    eos_ids: tuple[int, ...] = ()
    sampling: SamplingParams = SamplingParams()
    rank_logprobs: tuple[float, ...] | None = None
    bs: int = 1

    def __post_init__(self):
        if self.verify not in VERIFY_KINDS:
            raise ValueError(f"verify must be one of {', '.join(VERIFY_KINDS)}, got {self.verify!r}")


def target_choice(logits: torch.Tensor, verify: str, sampling: SamplingParams, stream: torch.Tensor,
                  step: torch.Tensor) -> torch.Tensor:
    """The target's token at every verified row: its draw from the uniform of the row's output
    position `step` (sampled, `verify.SamplingVerifier`), else its argmax. (rows,) int64."""
    if verify == "sampled":
        u = stream[step.clamp(max=stream.shape[0] - 1)]
        return sample_by_inverse_cdf(logits, u, float(sampling.temperature), int(sampling.top_k),
                                     float(sampling.top_p))
    return logits.argmax(dim=-1)


def accept(mask: torch.Tensor, ok: torch.Tensor, vs: torch.Tensor, dep: torch.Tensor):
    """The accepted path: a row is accepted when it and every ancestor (mask row) are `ok`.
    Returns (k: path length, last_row (1,), path_rows (bs,): the path's rows in order, then bs)."""
    bs = ok.shape[0]
    acc = vs & ~(mask & ~ok[None, :]).any(dim=1)
    last_row = torch.argmax(torch.where(acc, dep, -1)).view(1)  # (1,): a 0-d index would sync
    rows = torch.arange(bs, device=ok.device)
    return acc.sum(), last_row, torch.sort(torch.where(acc, rows, bs)).values


def outside_or_child(kid: torch.Tensor, kid_tok: torch.Tensor, hit: torch.Tensor, fallback: torch.Tensor,
                     candidates: int) -> torch.Tensor:
    """`synthetic.resolve_bonus`: the token of the `hit` child if there is one, else `fallback` if
    no child (`kid`) carries it, else the smallest id no child carries (< candidates). (1,)."""
    cand = torch.arange(candidates, device=kid.device)
    free = ~(kid[None, :] & (kid_tok[None, :] == cand[:, None])).any(dim=1)
    smallest = cand[torch.argmax(free.to(torch.int8)).view(1)]
    taken = (kid & (kid_tok == fallback)).any()
    return torch.where(hit.any(), kid_tok[torch.argmax(hit.to(torch.int8)).view(1)],
                       torch.where(taken, smallest, fallback))


class ModelSide:
    """One model's device state: its runner, prefix length and pending token (draft only)."""

    def __init__(self, runner: ModelRunner):
        dev = runner.device
        self.runner, self.model, self.cache = runner, runner.model, runner.cache
        self.prefix = torch.zeros((), dtype=torch.long, device=dev)
        self.pend_tok = torch.zeros((), dtype=torch.long, device=dev)
        self.pend_n = torch.zeros((), dtype=torch.long, device=dev)
        self.scratch = runner.cache.scratch_slot

    def forward(self, tokens, positions, slots, prefix, mask) -> torch.Tensor:
        logits = self.model(tokens, positions, self.cache, slots, prefix, mask)
        cut = self.runner.vocab_limit
        return logits if cut is None else logits[:, :cut]

    def move(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """KV of slots `src` to slots `dst` (both (L,) on the device; padding: scratch to scratch),
        gathered first, then written (sources may overlap destinations)."""
        kv = self.cache.kv
        kv.index_copy_(3, dst, kv.index_select(3, src))


class DeviceLoop:
    """Decode with `target` (and `draft`) on device tensors (module docstring).

    Build once per (runners, LoopConfig) and call `decode` per prompt: on CUDA the first call
    captures the graphs (`graphs=None`: on CUDA devices). fused: the bookkeeping by the Triton
    kernels of `kernels/tree_state.py` (None: on CUDA), else in torch, the reference; a kept
    subtree's re-root (`LoopPlan.keep`) runs in torch either way."""

    def __init__(self, target: ModelRunner | None, draft: ModelRunner | None, cfg: LoopConfig, *,
                 graphs: bool | None = None, fused: bool | None = None):
        self.cfg, self.dev = cfg, (target or draft).device
        self.t = ModelSide(target) if target is not None else None  # None: the draft side of async
        self.d = ModelSide(draft) if draft is not None else None
        plan = cfg.plan
        dev, long = self.dev, torch.long
        self.bs = cfg.bs if plan is None else plan.policy.bs
        n = 1 if plan is None else plan.nodes
        s = 1 if plan is None else plan.slots
        self.N, self.S = n, s
        z = lambda *shape, dtype=long: torch.zeros(*shape, dtype=dtype, device=dev)  # noqa: E731
        # one table, so that a gather or a scatter of a node's fields is one kernel, not five
        self.nodes = z(5, n + 1)
        self.tok, self.par, self.dep, self.rank, self.slot = self.nodes.unbind(0)
        self._fresh = torch.tensor([[0], [-1], [0], [0], [-1]], dtype=long, device=dev).expand(5, n + 1).clone()
        self.cum, self.anc = z(n + 1, dtype=torch.float64), z(n + 1, s + 1, dtype=torch.bool)
        self.count, self.nslots = z(()), z(())
        self._true = torch.ones((), dtype=torch.bool, device=dev)
        self.ar_n, self.ar_s, self.ar_bs = (torch.arange(x, device=dev) for x in (n, s, self.bs))
        if cfg.rank_logprobs is not None and plan is not None:
            need = max(x.k for x in plan.expansions) if plan.expansions else 0
            if len(cfg.rank_logprobs) < need:
                raise ValueError(f"rank_logprobs has {len(cfg.rank_logprobs)} ranks, the tree grows {need} "
                                 "children per node")
            self.rank_lp = torch.tensor(cfg.rank_logprobs, dtype=torch.float64, device=dev)
        else:
            self.rank_lp = None
        # streams the verdicts read by output position: uniforms (sampled) or ranks (synthetic)
        self.stream_len = cfg.max_new_tokens + 2 * self.bs + 2
        self.stream = z(self.stream_len, dtype=torch.float64 if cfg.verify == "sampled" else long)
        self.pos = z(())  # output position of the root: tokens produced so far
        self.out = z(cfg.max_new_tokens + self.bs + 1)
        self.nout, self.done, self.iters = z(()), z((), dtype=torch.bool), z(())
        self.flags = z(2)  # (done, nout) as one int64 pair: one small copy to the host per iteration
        self.max_iters = cfg.max_new_tokens + 2
        exps = () if plan is None else plan.expansions
        self.stats = z(self.max_iters + 1, 3 + 2 * len(exps))  # k, selected, tree size, (nodes, tokens) per forward
        self.eos = torch.tensor(cfg.eos_ids, dtype=long, device=dev) if cfg.eos_ids else None
        self.use_graphs = (graphs if graphs is not None else dev.type == "cuda") and dev.type == "cuda"
        self.graphs: list | None = None
        # per forward of the round: (nodes, tokens) forwarded; per verify: (selected, tree size)
        self._fwd_buf, self._vstats = z(max(2 * len(exps), 1)), z(2)
        self._fwd, self._fwd_tok = self._fwd_buf[0::2].unbind(0), self._fwd_buf[1::2].unbind(0)
        self._sel_n, self._tree_n = self._vstats.unbind(0)
        # the fused verify-and-update starts a fresh tree; a kept subtree's re-root stays in torch
        self.fused_expand = fused if fused is not None else dev.type == "cuda"
        self.fused = self.fused_expand and self.t is not None and (plan is None or not plan.keep)
        if self.fused_expand:
            self._fused_buffers()
        # a static round's node ids, on the device before any capture (a host copy cannot be captured)
        as_dev = lambda v: None if v is None else torch.tensor(v, dtype=long, device=dev)  # noqa: E731
        self._batch = [as_dev(x.batch) for x in exps]
        self._children = [as_dev(x.children) for x in exps]

    # ---- the tree ------------------------------------------------------------------------

    def _reset_tree(self, root: torch.Tensor) -> None:
        self.nodes.copy_(self._fresh)
        self.tok[:1].copy_(root.reshape(1))
        self.cum.zero_()
        self.anc.zero_()
        self.count.fill_(1)
        self.nslots.zero_()

    def _order(self, ok: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Node ids with `ok` first, then by cum_logprob (highest first), then by id; and `ok` in
        that order. ok: (N,) bool. One stable sort: an `ok` node's key is its cum_logprob held
        above -inf (ties among -inf nodes stay in id order), the others' key is -inf."""
        key = torch.where(ok, self.cum[: self.N].clamp(min=-1e300), float("-inf"))
        idx = torch.argsort(key, descending=True, stable=True)
        return idx, ok[idx]

    def _pick(self, ok: torch.Tensor, m: int) -> torch.Tensor:
        """The best `m` nodes of `ok` (`_order`) in ascending id order, N for none: (m,)."""
        idx, oks = self._order(ok)
        if m > self.N:
            idx = torch.cat([idx, idx.new_full((m - self.N,), self.N)])
            oks = torch.cat([oks, oks.new_zeros(m - self.N)])
        return torch.sort(torch.where(oks[:m], idx[:m], self.N)).values

    def _expand(self, e: int, x: Expansion) -> None:
        """One draft forward of the round and the children it grows (the module docstring)."""
        N, S, d, plan = self.N, self.S, self.d, self.cfg.plan
        if x.batch is not None:
            batch = self._batch[e]
        else:
            open_ = (self.ar_n < self.count) & (self.slot[:N] < 0)
            if plan.policy.max_depth > 0:
                open_ &= self.dep[:N] < plan.policy.max_depth
            batch = self._pick(open_, x.rows)
        valid = batch < N
        nb = valid.sum()
        ar = torch.arange(x.rows, device=self.dev)
        new_slot = self.nslots + ar  # valid rows come first (ascending ids, N last)
        self.slot[batch] = torch.where(valid, new_slot, -1)
        self.anc[batch, torch.where(valid, new_slot, S)] = self._true  # a Python True is a host copy
        self.nslots += nb
        base = d.prefix + d.pend_n if x.pending else d.prefix
        fields = self.nodes[:, batch]
        tok = torch.where(valid, fields[0], 0)
        pos = torch.where(valid, base + fields[2], 0)
        slots = torch.where(valid, base + new_slot, d.scratch)
        mask = self.anc[batch, :S] & valid[:, None]
        mask[:, 0] |= ~valid
        if x.pending:
            has = d.pend_n > 0
            tok = torch.cat([torch.where(has, d.pend_tok, 0).view(1), tok])
            pos = torch.cat([torch.where(has, d.prefix, 0).view(1), pos])
            slots = torch.cat([torch.where(has, d.prefix, d.scratch).view(1), slots])
            mask = torch.cat([(~has & (self.ar_s == 0)).view(1, S), mask])
            self._fwd_tok[e].copy_(nb + d.pend_n)
        else:
            self._fwd_tok[e].copy_(nb)
        self._fwd[e].copy_(nb)
        logits = d.forward(tok, pos, slots, base, mask)
        if x.pending:
            logits = logits[1:]
            live = ~self.done  # after the stop the caller's draft state stays as it was
            d.prefix.copy_(torch.where(live, base, d.prefix))
            d.pend_n.copy_(torch.where(live, 0, d.pend_n))
        values, indices = top_logprobs(logits, x.k, d.model.kernels.tree_growth)
        if x.children is not None:
            children = self._children[e]
        else:
            children = self.count + ar[:, None] * x.k + torch.arange(x.k, device=self.dev)[None, :]
            children = torch.where(valid[:, None] & (children < N), children, N)
        lp = values.double() if self.rank_lp is None else self.rank_lp[: x.k].expand(x.rows, x.k)
        parent = batch[:, None].expand(x.rows, x.k)
        rk = torch.arange(x.k, device=self.dev).expand(x.rows, x.k)
        self.nodes[:, children] = torch.stack([indices, parent, (fields[2] + 1)[:, None].expand(x.rows, x.k), rk,
                                               torch.full_like(rk, -1)])
        self.cum[children] = self.cum[parent] + lp
        self.anc[children] = self.anc[parent]
        if x.children is not None:
            self.count.fill_(x.count_after)
        else:
            self.count += nb * x.k

    def draft_round(self) -> None:
        """Every draft forward of one round (`LoopPlan.expansions`)."""
        for e, x in enumerate(self.cfg.plan.expansions):
            if self.fused_expand:
                self._expand_fused(e, x)
            else:
                self._expand(e, x)

    # ---- verify and update ---------------------------------------------------------------

    def verify_and_update(self) -> None:
        """Select, verify, accept, commit both caches, re-root, append the produced tokens; then
        (done, tokens so far) into `flags`, what the host reads back."""
        if self.fused:
            self._verify_fused()
        else:
            self._verify_torch()
        self.flags.copy_(torch.stack([self.done.to(torch.long), self.nout]))

    def _verify_torch(self) -> None:
        N, S, bs, t = self.N, self.S, self.bs, self.t
        plan, cfg = self.cfg.plan, self.cfg
        ar = self.ar_bs
        if plan is None:
            sel = torch.zeros(1, dtype=torch.long, device=self.dev)
        elif plan.policy.kind == "static":
            sel = torch.where(ar < self.count, ar, N)  # a vocabulary narrower than a fan-out grows fewer
        else:
            sel = self._pick(self.ar_n < self.count, bs)
        vs = sel < N
        self._sel_n.copy_(vs.sum())
        self._tree_n.copy_(self.count)
        f_tok, f_par, dep, f_rank, sslot = self.nodes[:, sel].unbind(0)
        tp = t.prefix
        tok = torch.where(vs, f_tok, 0)
        pos = torch.where(vs, tp + dep, 0)
        slots = torch.where(vs, tp + ar, t.scratch)
        mask = self.anc[sel][:, torch.where(sslot >= 0, sslot, S)] & (sslot >= 0)[None, :]
        mask |= torch.eye(bs, dtype=torch.bool, device=self.dev)
        mask &= vs[:, None] & vs[None, :]
        mask[:, 0] |= ~vs
        logits = t.forward(tok, pos, slots, tp, mask)

        # the target's choice at every selected node, and which nodes it accepts
        step = self.pos + dep  # output position of each node's next token
        choice = target_choice(logits, cfg.verify, cfg.sampling, self.stream, step)
        inv = torch.zeros(N + 1, dtype=torch.long, device=self.dev)
        inv[sel] = ar
        prow = inv[f_par.clamp(min=0)]
        if cfg.verify == "synthetic":
            ok = f_rank == self.stream[(step - 1).clamp(0, self.stream_len - 1)]
        else:
            ok = tok == choice[prow]
        k, last_row, path_rows = accept(mask, vs & ((ar == 0) | ok), vs, dep)
        last = sel[last_row]
        bonus = choice[last_row]
        if cfg.verify == "synthetic":
            bonus = self._synthetic_bonus(last, bonus)
        on_path = ar < k

        # target: the accepted path's KV into the prefix (fixed size: padding moves scratch)
        live = ~self.done
        if plan is not None:  # autoregressive: the one row was written where it stays (src = dst)
            src = torch.where(on_path, tp + path_rows.clamp(max=bs - 1), t.scratch)
            t.move(src, torch.where(on_path, tp + ar, t.scratch))
        t.prefix += k * live

        # the produced tokens: the path's drafted tokens, then the bonus
        path_nodes = torch.where(on_path, sel[path_rows.clamp(max=bs - 1)], N)
        nxt = torch.cat([path_nodes[1:], path_nodes.new_full((1,), N)])
        new = torch.where(ar == k - 1, bonus, self.tok[nxt])
        self._emit(new, k, live)
        self.pos += k * live
        if plan is None:  # autoregressive: the bonus is the next root
            self.tok[:1] = bonus
        else:
            self._reroot(path_nodes, on_path, last, bonus, live)

    def _synthetic_bonus(self, last: torch.Tensor, fallback: torch.Tensor, r: torch.Tensor | None = None) -> torch.Tensor:
        """`synthetic.resolve_bonus` on the device: the rank-r child of `last` in the whole tree,
        else `fallback` if it is not a child token of `last`, else the smallest id that is not.
        r: the target's rank after `last` (default: the replayed stream's)."""
        N = self.N
        if r is None:
            r = self.stream[(self.pos + self.dep[last]).clamp(max=self.stream_len - 1)]
        kid = (self.ar_n < self.count) & (self.par[:N] == last)
        most = self.cfg.plan.policy.w if self.cfg.plan.policy.kind != "static" else N  # children of one node
        return outside_or_child(kid, self.tok[:N], kid & (self.rank[:N] == r), fallback, most + 1)

    def _emit(self, new: torch.Tensor, k: torch.Tensor, live: torch.Tensor) -> None:
        """Append new[:k] to the output, cut after an EOS id and at the token budget; record the
        iteration's stats. new: (bs,) int64."""
        ar, cfg = self.ar_bs, self.cfg
        take = k
        stop = torch.zeros((), dtype=torch.bool, device=self.dev)
        if self.eos is not None:
            is_eos = (new[:, None] == self.eos[None, :]).any(dim=1) & (ar < k)
            stop = is_eos.any()
            take = torch.where(stop, torch.argmax(is_eos.to(torch.int8)) + 1, k)
        take = torch.minimum(take, cfg.max_new_tokens - self.nout) * live
        idx = torch.where(ar < take, self.nout + ar, self.out.shape[0] - 1)
        self.out[idx] = new
        self.nout += take
        self.done |= live & (stop | (self.nout >= cfg.max_new_tokens))
        row = [k, self._sel_n, self._tree_n]
        for f, ft in zip(self._fwd, self._fwd_tok):
            row += [f, ft]
        it = torch.where(live, self.iters, self.max_iters).view(1)
        self.stats.index_copy_(0, it, torch.stack([x.reshape(()) for x in row]).to(torch.long).view(1, -1))
        self.iters += live.to(torch.long)

    def _reroot(self, path_nodes, on_path, last, bonus, live) -> None:
        """The draft's commit: expanded path nodes' KV into its prefix; then either the bonus
        node's subtree kept (`LoopPlan.keep`, compacted right behind the prefix) or a fresh tree
        at the bonus token, whose pending token is the path's last node if it was never forwarded."""
        N, S, d = self.N, self.S, self.d
        ar = self.ar_bs
        pslot = self.slot[path_nodes]
        expd = on_path & (pslot >= 0)
        n_exp = expd.sum()
        dp = d.prefix.clone()
        src = torch.where(expd, dp + pslot, d.scratch)
        dst = torch.where(expd, dp + ar, d.scratch)
        pend = self.slot[last] < 0
        if not self.cfg.plan.keep:
            d.move(src, dst)
            d.prefix += n_exp * live
            d.pend_n.copy_(torch.where(live, pend.to(torch.long).reshape(()), d.pend_n))
            d.pend_tok.copy_(torch.where(live, self.tok[last].reshape(()), d.pend_tok))
            self._reset_tree(bonus)
            return
        # keep: the subtree under the bonus node, best-first up to keep_limit nodes
        kid = (self.ar_n < self.count) & (self.par[: N] == last) & (self.tok[: N] == bonus)
        found = kid.any()
        b = torch.argmax(kid.to(torch.int8)).view(1)
        bslot = self.slot[b]
        member = (self.ar_n < self.count) & torch.where(bslot >= 0, self.anc[:N].index_select(1, bslot.clamp(min=0))[:, 0],
                                                        self.ar_n == b)
        keep = min(self.cfg.plan.policy.keep_limit, N)
        old = self._pick(member, keep)  # (keep,) ascending, N padding
        ok = old < N
        inv = torch.full((N + 1,), -1, dtype=torch.long, device=self.dev)
        inv[old] = torch.where(ok, torch.arange(keep, device=self.dev), -1)
        oslot = self.slot[old]
        has_slot = ok & (oslot >= 0)
        kept_s = torch.zeros(S + 1, dtype=torch.bool, device=self.dev)
        kept_s[torch.where(has_slot, oslot, S)] = self._true
        kept_s = kept_s[:S]
        m_s = kept_s.sum()
        new_of_old = torch.cumsum(kept_s.to(torch.long), 0) - 1
        old_sorted = torch.sort(torch.where(kept_s, self.ar_s, S)).values  # (S,): kept old slots, S padding
        # new arrays (valid where found)
        n_tok = torch.where(ok, self.tok[old], 0)
        n_par = torch.where(ok, inv[self.par[old].clamp(min=0)], -1)
        n_dep = torch.where(ok, self.dep[old] - self.dep[b], 0)
        n_cum = torch.where(ok, self.cum[old] - self.cum[b], 0.0)
        n_rank = torch.where(ok, self.rank[old], 0)
        n_slot = torch.where(has_slot, new_of_old[oslot.clamp(0, S - 1)], -1)
        n_anc = self.anc[old][:, old_sorted] & (self.ar_s < m_s)[None, :] & ok[:, None]
        m = ok.sum()
        # KV: path first, then the kept slots right behind it
        ksrc = torch.where((self.ar_s < m_s) & found, dp + old_sorted, d.scratch)
        kdst = torch.where((self.ar_s < m_s) & found, dp + n_exp + self.ar_s, d.scratch)
        d.move(torch.cat([src, ksrc]), torch.cat([dst, kdst]))
        d.prefix += n_exp * live
        d.pend_n.copy_(torch.where(live, (pend & ~found).to(torch.long).reshape(()), d.pend_n))
        d.pend_tok.copy_(torch.where(live, self.tok[last].reshape(()), d.pend_tok))
        self._reset_tree(bonus)
        f = found
        for arr, new in ((self.tok, n_tok), (self.par, n_par), (self.dep, n_dep), (self.cum, n_cum),
                         (self.rank, n_rank), (self.slot, n_slot)):
            arr[:keep] = torch.where(f, new, arr[:keep])
        self.anc[:keep, :S] = torch.where(f, n_anc, self.anc[:keep, :S])
        self.count.copy_(torch.where(f, m, self.count))
        self.nslots.copy_(torch.where(f, m_s, self.nslots))

    # ---- the same steps by the Triton kernels (kernels/tree_state.py) --------------------

    def _fused_buffers(self) -> None:
        """Static inputs of the fused steps' forwards (a CUDA graph holds their addresses)."""
        dev, long, plan = self.dev, torch.long, self.cfg.plan
        z = lambda *shape, dtype=long: torch.zeros(*shape, dtype=dtype, device=dev)  # noqa: E731
        self._ex = []
        for x in () if plan is None else plan.expansions:
            r = x.rows + x.pending
            self._ex.append({"batch": z(x.rows), "tok": z(r), "pos": z(r), "slot": z(r),
                             "mask": z(r, self.S, dtype=torch.bool), "base": z(())})
        bs = self.bs
        self._vf = {"sel": z(bs), "tok": z(bs), "pos": z(bs), "slot": z(bs), "mask": z(bs, bs, dtype=torch.bool),
                    "u": z(bs, dtype=torch.float64), "t_move": z(2, bs), "d_move": z(2, bs)}
        self._dummy_f64 = z(1, dtype=torch.float64)
        self._dummy_long = z(1)

    def _expand_fused(self, e: int, x: Expansion) -> None:
        d, b, plan = self.d, self._ex[e], self.cfg.plan
        anc = self.anc.view(torch.int8)
        ts.expand_prep_kernel[(1,)](
            self.nodes, self.cum, anc, self.count, self.nslots, d.prefix, d.pend_n, d.pend_tok,
            self.done.view(torch.int8), self._batch[e] if x.batch is not None else self._dummy_long,
            b["batch"], b["tok"], b["pos"], b["slot"], b["mask"].view(torch.int8), b["base"], self._fwd_buf[2 * e :],
            self.N, self.S, d.scratch, plan.policy.max_depth,
            ROWS=x.rows, ROWS_P2=ts.p2(x.rows), PENDING=x.pending, DYNAMIC=x.batch is None,
            BLOCK_N=ts.p2(self.N), BLOCK_J=32, BLOCK_S=ts.p2(self.S))  # fmt: skip
        logits = d.forward(b["tok"], b["pos"], b["slot"], b["base"], b["mask"])
        if x.pending:
            logits = logits[1:]
        values, indices = top_logprobs(logits, x.k, d.model.kernels.tree_growth)
        synth = self.rank_lp is not None
        ts.grow_kernel[(1,)](
            self.nodes, self.cum, anc, self.count, b["batch"], values.contiguous(), indices.contiguous(),
            self._children[e] if x.children is not None else self._dummy_long,
            self.rank_lp if synth else self._dummy_f64, self.N, self.S, x.count_after,
            ROWS=x.rows, ROWS_P2=ts.p2(x.rows), K=x.k, K_P2=ts.p2(x.k), STATIC=x.children is not None, SYNTH=synth,
            BLOCK_S=ts.p2(self.S))  # fmt: skip

    def _verify_fused(self) -> None:
        cfg, plan, t, v, bs = self.cfg, self.cfg.plan, self.t, self._vf, self.bs
        anc = self.anc.view(torch.int8)
        sampled = cfg.verify == "sampled"
        ts.verify_prep_kernel[(1,)](
            self.nodes, self.cum, anc, self.count, t.prefix, self.stream if sampled else self._dummy_f64, self.pos,
            v["sel"], v["tok"], v["pos"], v["slot"], v["mask"].view(torch.int8), v["u"], self._vstats,
            self.N, self.S, t.scratch, self.stream_len,
            BS=bs, BS_P2=ts.p2(bs), DYNAMIC=plan is not None and plan.policy.kind != "static", SAMPLED=sampled,
            BLOCK_N=ts.p2(self.N), BLOCK_J=32)  # fmt: skip
        logits = t.forward(v["tok"], v["pos"], v["slot"], t.prefix, v["mask"])
        if sampled:  # the kernel gathered each row's uniform
            sp = cfg.sampling
            choice = sample_by_inverse_cdf(logits, v["u"], float(sp.temperature), int(sp.top_k), float(sp.top_p))
        else:
            choice = logits.argmax(dim=-1)
        d = self.d
        nfwd = 0 if plan is None else len(plan.expansions)
        cand = (plan.policy.w if plan.policy.kind != "static" else self.N) + 1 if plan is not None else 1
        ts.verify_finish_kernel[(1,)](
            self.nodes, self.cum, anc, self.count, self.nslots, v["sel"], v["mask"].view(torch.int8), choice,
            self.stream if cfg.verify != "greedy" else self._dummy_long, self.pos, t.prefix,
            d.prefix if d else self._dummy_long, d.pend_n if d else self._dummy_long,
            d.pend_tok if d else self._dummy_long, self.out, self.nout, self.done.view(torch.int8), self.iters,
            self.stats, self._vstats, self._fwd_buf, self.eos if self.eos is not None else self._dummy_long,
            v["t_move"], v["d_move"],
            self.N, self.S, t.scratch, d.scratch if d else 0, self.stream_len, cfg.max_new_tokens, self.max_iters,
            self.out.shape[0], self.stats.shape[1],
            BS=bs, BS_P2=ts.p2(bs), SYNTH=cfg.verify == "synthetic", DRAFT=d is not None,
            NEOS=0 if self.eos is None else len(cfg.eos_ids), NFWD=nfwd, FWD_P2=ts.p2(2 * nfwd), CAND_P2=ts.p2(cand),
            BLOCK_R=128)  # fmt: skip
        if plan is not None:  # autoregressive: the one row was written where it stays (src = dst)
            t.move(v["t_move"][0], v["t_move"][1])
        if d is not None:
            d.move(v["d_move"][0], v["d_move"][1])

    # ---- the host loop -------------------------------------------------------------------

    def _iteration(self) -> None:
        if self.cfg.plan is not None:
            self.draft_round()
        self.verify_and_update()

    def start(self, root: int, stream: Sequence[float] | Sequence[int] | None) -> None:
        """Reset for a prompt whose prefixes the runners hold (`ModelRunner.prefill`): the root is
        the prompt's last token; stream: the uniforms (sampled) or the rank path (synthetic)."""
        self.t.prefix.fill_(self.t.runner.prefix_len)
        if self.d is not None:
            self.d.prefix.fill_(self.d.runner.prefix_len)
            self.d.pend_n.zero_()
        self._reset_tree(torch.tensor(root, dtype=torch.long, device=self.dev))
        self.pos.zero_()
        self.nout.zero_()
        self.done.zero_()
        self.iters.zero_()
        if stream is not None:
            vals = list(stream)[: self.stream_len]
            pad = -1 if self.cfg.verify == "synthetic" else 0.0
            vals += [pad] * (self.stream_len - len(vals))
            self.stream.copy_(torch.tensor(vals, dtype=self.stream.dtype))

    def decode(self, root: int, stream=None) -> tuple[list[int], list[list[int]], list[tuple[float, float]]]:
        """Decode after the prefilled prefixes. Returns (tokens, per-iteration stats rows,
        per-iteration (draft, verify) time in ms: device time of the replays on CUDA, else
        host wall time)."""
        self.start(root, stream)
        if self.use_graphs and self.graphs is None:
            self._capture()
            self.start(root, stream)
        times: list[tuple[float, float]] = []
        if not self.use_graphs:
            for _ in range(self.max_iters):
                t0 = time.perf_counter()
                if self.cfg.plan is not None:
                    self.draft_round()
                t1 = time.perf_counter()
                self.verify_and_update()
                times.append(((t1 - t0) * 1e3, (time.perf_counter() - t1) * 1e3))
                if bool(self.done):
                    break
        else:
            times = self._replay_loop()
        n, iters = int(self.nout), int(self.iters)
        self.t.runner.prefix_len = int(self.t.prefix)
        if self.d is not None:
            self.d.runner.prefix_len = int(self.d.prefix)
            self.d.runner.pending = [int(self.d.pend_tok)] if int(self.d.pend_n) else []
            self.d.runner.tree_len = 0
        return self.out[:n].tolist(), self.stats[:iters].tolist(), times[:iters]

    def _replay_loop(self) -> list[tuple[float, float]]:
        """Launch iterations, reading (done, tokens so far) one iteration late, so the GPU always
        has the next iteration queued; an iteration launched after the stop changes nothing the
        caller reads. Once the budget is within one iteration's tokens (bs), each iteration is
        read before the next is launched: no whole iteration is wasted at the end of a decode
        (one may still be after an EOS, which only the device sees)."""
        flags = torch.zeros(2, 2, dtype=torch.long, pin_memory=True)
        events = []
        copied = [torch.cuda.Event(), torch.cuda.Event()]

        def read(i: int) -> tuple[bool, int]:
            copied[i % 2].synchronize()
            return bool(flags[i % 2, 0]), int(flags[i % 2, 1])

        for i in range(self.max_iters):
            marks = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
            marks[0].record()
            if self.graphs[0] is not None:
                self.graphs[0].replay()
            marks[1].record()
            self.graphs[1].replay()
            marks[2].record()
            events.append(marks)
            flags[i % 2].copy_(self.flags, non_blocking=True)
            copied[i % 2].record()
            if i > 0:
                done, nout = read(i - 1)
                if done:
                    break
                if self.cfg.max_new_tokens - nout <= self.bs and read(i)[0]:
                    break
        torch.cuda.synchronize()
        return [(a.elapsed_time(b), b.elapsed_time(c)) for a, b, c in events]

    def _capture(self) -> None:
        """CUDA graphs of the draft round and of verify-and-update (`capture.capture_graphs`: two
        warm-up iterations first, so kernels compile and autotune outside the capture)."""
        draft = self.draft_round if self.cfg.plan is not None else None
        self.graphs, _ = capture_graphs([draft, self.verify_and_update], warmup=2)

