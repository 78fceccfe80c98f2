"""The draft tree: growth, selection, masks and re-rooting (tree semantics: docs/design.md).

A `DraftTree` is plain host-side bookkeeping: it never runs a model. Node 0 is the root, the last
verified token, whose KV neither model has yet. Node ids follow creation order, so a parent's id
is always smaller than its children's, and "ties: earlier-created first" means "smaller id first".

Two kinds of slot numbers appear here, both relative to the start of a cache's tree region:
  * the *draft* slot of a node (`slots[i]`) is given when the draft forwards the node (expands
    it); expanded nodes are numbered 0, 1, 2, ... in the order they were forwarded, so the draft's
    tree region is contiguous (the evolving tree cache);
  * the *target* slot of a selected node is its position in `select(bs)`.

One expansion, end to end (see `expand`):
    batch = tree.next_batch()                 # the w best unexpanded nodes (static: one level)
    inputs = tree.draft_inputs(batch)         # tokens, depths, slots, mask (w, expanded nodes)
    logits = forward(*inputs)                 # the draft model; see decoder.ModelRunner
    tree.grow(batch, logits)                  # top-w children of every forwarded node
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from swiftspec.kernels.topk import MAX_K, logsoftmax_topk, logsoftmax_topk_packed, unpack_topk
from swiftspec.runtime.kernel_config import TREE_GROWTH_IMPLS, KernelConfig
from swiftspec.spec import TreePolicy

#: forward(tokens, depths, slots, tree_mask) -> logits (T, vocab); the draft side's forward.
ForwardFn = Callable[[list[int], list[int], list[int], torch.Tensor], torch.Tensor]
# (logits (T, vocab), k) -> host lists (values (T, k), indices (T, k)): `top_logprobs_host`, or a
# runner's own (`ModelRunner.top_logprobs`: from a captured graph on CUDA)
TopFn = Callable[[torch.Tensor, int], tuple[list[list[float]], list[list[int]]]]


@dataclass
class DraftTree:
    """A token tree rooted at the last verified token.

    Per node (index = node id, creation order): `tokens`, `parents` (-1 for the root), `depths`
    (root 0), `cum_logprob` (sum of draft log-probabilities from the root; root 0.0), `slots`
    (draft tree-region slot, -1 while unexpanded), `children` (ids in draft-rank order) and, for a
    static policy, `topo` (the node's index in `policy.topology`).

    rank_logprobs: synthetic acceptance only (synthetic.py): log q[rank] of the acceptance profile,
    shape (>= w,). When set, a child of draft rank r gets cum_logprob = parent's + rank_logprobs[r]
    instead of the draft's own log-probability, so the tree grows to the shape the simulator's rank
    view predicts (a random-weight draft is nearly flat and would otherwise fill the tree with
    root siblings); the tokens are still the draft's top-ranked ones.
    """

    policy: TreePolicy
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    cum_logprob: list[float] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    children: list[list[int]] = field(default_factory=list)
    topo: list[int] = field(default_factory=list)
    num_slots: int = 0  # expanded nodes = draft tree-region slots in use
    rank_logprobs: tuple[float, ...] | None = None

    @classmethod
    def fresh(cls, root_token: int, policy: TreePolicy, rank_logprobs: Sequence[float] | None = None) -> DraftTree:
        """A tree holding only the root (unexpanded); rank_logprobs: see the class docstring."""
        tree = cls(policy, rank_logprobs=None if rank_logprobs is None else tuple(float(x) for x in rank_logprobs))
        tree._add(int(root_token), -1, 0.0, topo=0)
        return tree

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def static(self) -> bool:
        return self.policy.kind == "static"

    def _add(self, token: int, parent: int, cum: float, topo: int = -1) -> int:
        node = len(self.tokens)
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(0 if parent < 0 else self.depths[parent] + 1)
        self.cum_logprob.append(cum)
        self.slots.append(-1)
        self.children.append([])
        self.topo.append(topo)
        if parent >= 0:
            self.children[parent].append(node)
        return node

    def expanded(self, node: int) -> bool:
        return self.slots[node] >= 0

    def path_to(self, node: int) -> list[int]:
        """Node ids from the root down to `node`, both included."""
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def child_with_token(self, node: int, token: int) -> int | None:
        """The child of `node` carrying `token` (siblings carry distinct tokens), or None."""
        for c in self.children[node]:
            if self.tokens[c] == token:
                return c
        return None

    def _best_first(self, nodes: Sequence[int]) -> list[int]:
        """`nodes` ordered by cum_logprob, highest first; ties: earlier-created first."""
        return sorted(nodes, key=lambda n: (-self.cum_logprob[n], n))

    # ---- growth ---------------------------------------------------------------------------

    def _topo_children(self, topo_id: int) -> list[int]:
        assert self.policy.topology is not None
        return [i for i, p in enumerate(self.policy.topology) if p == topo_id]

    def next_batch(self) -> list[int]:
        """Nodes the next expansion forwards (ascending ids); [] when nothing can be grown.

        Dynamic: the (up to) `w` unexpanded nodes of highest cum_logprob, skipping nodes at
        `max_depth` (when > 0). Static: every unexpanded node of the shallowest level that still
        has children in the topology (the topology is filled level by level).
        """
        open_ = [n for n in range(len(self)) if self.slots[n] < 0]
        if self.static:
            growable = [n for n in open_ if self._topo_children(self.topo[n])]
            if not growable:
                return []
            level = min(self.depths[n] for n in growable)
            return [n for n in growable if self.depths[n] == level]
        if self.policy.max_depth > 0:
            open_ = [n for n in open_ if self.depths[n] < self.policy.max_depth]
        return sorted(self._best_first(open_)[: self.policy.w])

    def draft_inputs(self, batch: Sequence[int]) -> tuple[list[int], list[int], list[int], torch.Tensor]:
        """Give `batch` draft slots and build the draft forward's inputs.

        Returns tokens (T,), depths (T,), slots (T,) relative to the tree region, and the
        non-square mask (T, num_slots) bool: row i is True at the slots of node batch[i] and of
        its ancestors (all expanded already, because a node is only created by expanding its
        parent).
        """
        for n in batch:
            assert self.slots[n] < 0, "node forwarded twice"
            self.slots[n] = self.num_slots
            self.num_slots += 1
        mask = np.zeros((len(batch), self.num_slots), dtype=np.bool_)  # numpy: ~10x cheaper per row than torch
        for i, n in enumerate(batch):
            mask[i, [self.slots[a] for a in self.path_to(n)]] = True
        return ([self.tokens[n] for n in batch], [self.depths[n] for n in batch], [self.slots[n] for n in batch],
                torch.from_numpy(mask))

    def grow(self, batch: Sequence[int], logits: torch.Tensor, top: TopFn | None = None) -> None:
        """Add the draft's top-ranked tokens under every node of `batch`.

        logits: (len(batch), vocab), the draft's next-token logits at those nodes. Dynamic: `w`
        children each; static: as many as the topology gives the node, in rank order. top: how
        the top-k reaches the host (default `top_logprobs_host` with the device's default impl,
        `KernelConfig.resolve(device).tree_growth`).
        """
        if self.static:
            counts = [len(self._topo_children(self.topo[n])) for n in batch]
        else:
            counts = [self.policy.w] * len(batch)
        k = min(max(counts), logits.shape[-1])
        if top is None:
            impl = KernelConfig.resolve(logits.device).tree_growth
            top = functools.partial(top_logprobs_host, impl=impl)
        values, indices = top(logits, k)  # one device sync per expansion
        rank_lp = self.rank_logprobs
        if rank_lp is not None and len(rank_lp) < k:
            raise ValueError(f"rank_logprobs has {len(rank_lp)} ranks, the tree grows {k} children per node")
        for row, n in enumerate(batch):
            topo_kids = self._topo_children(self.topo[n]) if self.static else []
            for r in range(min(counts[row], k)):
                topo = topo_kids[r] if self.static else -1
                lp = values[row][r] if rank_lp is None else rank_lp[r]
                self._add(indices[row][r], n, self.cum_logprob[n] + lp, topo=topo)

    def expand(self, forward: ForwardFn, top: TopFn | None = None) -> int:
        """One expansion (= one draft forward); returns the number of tokens forwarded (0: none).
        top: see `grow`."""
        batch = self.next_batch()
        if not batch:
            return 0
        logits = forward(*self.draft_inputs(batch))
        self.grow(batch, logits, top)
        return len(batch)

    # ---- selection and verification inputs -----------------------------------------------

    def select(self, bs: int) -> list[int]:
        """The `bs` nodes of highest cum_logprob (ties: earlier first), in ascending id order.

        Connected and root-including because a child's cum_logprob <= its parent's and a child is
        created after its parent. Ascending ids put every parent before its children.
        """
        return sorted(self._best_first(range(len(self)))[:bs])

    def verify_inputs(self, selected: Sequence[int]) -> tuple[list[int], list[int], list[int], torch.Tensor]:
        """Inputs of the target's verify forward over `selected` (target slot = position).

        Returns tokens (S,), depths (S,), slots (S,) = 0..S-1 and the square mask (S, S) bool:
        mask[i, j] iff selected[j] is selected[i] or one of its ancestors.
        """
        pos = {n: i for i, n in enumerate(selected)}
        mask = np.zeros((len(selected), len(selected)), dtype=np.bool_)
        for i, n in enumerate(selected):
            mask[i, [pos[a] for a in self.path_to(n)]] = True
        return ([self.tokens[n] for n in selected], [self.depths[n] for n in selected], list(range(len(selected))),
                torch.from_numpy(mask))

    # ---- re-rooting -----------------------------------------------------------------------

    def reroot(self, node: int, keep: int | None = None) -> tuple[DraftTree, list[int]]:
        """The subtree under `node` as a new tree rooted at it, and where its KV must come from.

        keep: keep at most this many nodes (the best-first ones, which stay connected), so a tree
        kept from round to round cannot grow without bound.
        Returns (tree, old_slots): depths and cum_logprob are re-based on `node`; node ids keep
        their creation order; expanded nodes get slots 0..m-1 in the order of their old slots,
        and `old_slots[j]` is the old draft slot whose KV the new slot j must receive.
        """
        assert not self.static, "static trees are refilled from a fresh root"
        members, inside = [node], {node}
        for n in range(node + 1, len(self)):  # children come after parents: one pass suffices
            if self.parents[n] in inside:
                members.append(n)
                inside.add(n)
        if keep is not None and len(members) > keep:
            members = sorted(self._best_first(members)[:keep])
        new_id = {old: i for i, old in enumerate(members)}
        base_depth, base_cum = self.depths[node], self.cum_logprob[node]
        tree = DraftTree(self.policy, rank_logprobs=self.rank_logprobs)
        for old in members:
            parent = new_id[self.parents[old]] if old != node else -1
            tree._add(self.tokens[old], parent, self.cum_logprob[old] - base_cum)
            tree.depths[-1] = self.depths[old] - base_depth
        old_slots = sorted(self.slots[old] for old in members if self.slots[old] >= 0)
        slot_map = {s: j for j, s in enumerate(old_slots)}
        for i, old in enumerate(members):
            if self.slots[old] >= 0:
                tree.slots[i] = slot_map[self.slots[old]]
        tree.num_slots = len(old_slots)
        return tree, old_slots


def _kernel_topk(logits: torch.Tensor, impl: str) -> bool:
    """Whether tree growth's top-k runs the Triton kernel: impl (`KernelConfig.tree_growth`)
    "triton" (launched eagerly), or "graph" (the kernel captured per bucket, `GraphRunner`) on a
    CUDA tensor; "torch" and "graph" elsewhere run `torch.topk`. The kernel needs unit-stride rows."""
    if impl not in TREE_GROWTH_IMPLS:
        raise ValueError(f"tree growth must be one of {', '.join(TREE_GROWTH_IMPLS)}, got {impl!r}")
    return (impl == "triton" or (impl == "graph" and logits.is_cuda)) and logits.stride(-1) == 1


def top_logprobs(logits: torch.Tensor, k: int, impl: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest log-probabilities of each row, largest first: (values (T, k) float32,
    indices (T, k) int64) of log_softmax(logits (T, V)). What tree growth runs after every draft
    forward; impl: one of `TREE_GROWTH_IMPLS` (`KernelConfig.tree_growth`; the kernel takes
    k <= `topk.MAX_K`, torch any k)."""
    if _kernel_topk(logits, impl):
        if k <= MAX_K:
            return logsoftmax_topk(logits, k)
    return torch.topk(torch.log_softmax(logits.float(), dim=-1), k, dim=-1)


def top_logprobs_host(logits: torch.Tensor, k: int, impl: str) -> tuple[list[list[float]], list[list[int]]]:
    """`top_logprobs` brought to the host as lists (values (T, k), indices (T, k)) with one
    device-to-host copy and one sync on CUDA: the kernel writes both into one buffer, copied
    non-blocking (into pinned memory) and then waited for, instead of two `.tolist()` calls (two
    pageable copies, two syncs; docs/decisions.md)."""
    t = logits.shape[0]
    if _kernel_topk(logits, impl):
        if k <= MAX_K:
            (packed,) = to_host(logsoftmax_topk_packed(logits, k))
            values, indices = unpack_topk(packed.numpy(), t, k)
            return values.tolist(), indices.tolist()
    values, indices = to_host(*torch.topk(torch.log_softmax(logits.float(), dim=-1), k, dim=-1))
    return values.tolist(), indices.tolist()


def to_host(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """Host copies of `tensors`; on CUDA non-blocking copies and one stream sync for all."""
    if not tensors or tensors[0].device.type != "cuda":
        return [x.cpu() for x in tensors]
    out = [x.to("cpu", non_blocking=True) for x in tensors]
    torch.cuda.current_stream(tensors[0].device).synchronize()
    return out


def tree_slots_needed(policy: TreePolicy) -> int:
    """Most draft tree-region slots a round can occupy: a kept tree (`policy.keep_limit` nodes), `d`
    expansions of up to `w` nodes, and (async) the expansions that refill a tree to `bs` nodes."""
    if policy.kind == "static":
        return len(policy.topology or ())
    return policy.keep_limit + policy.d * policy.w + policy.bs
