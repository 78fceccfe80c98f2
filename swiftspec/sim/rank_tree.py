"""The draft tree in the simulator's *rank view* (docs/design.md): a child is named by its draft rank.

Every node's children have the same draft probabilities (`AcceptanceProfile.draft_prob_by_rank`),
so a node's `cum_logprob` is the sum of log q[rank] along its path from the root. The target's
behaviour on one request is a *rank path* r_0, r_1, ...: the rank of the target's token among the
draft's candidates at each position (-1 = outside the draft's top-k, never in any tree).

`RankTree` implements exactly the shared semantics: expansion of the `w` best unexpanded nodes
(ties: earlier-created first), selection of the `bs` best nodes, greedy verification against a
rank path, and re-rooting at the bonus token. `request_trajectory` replays one request under a
mode and policy and returns what each iteration did (forward sizes, tree sizes, tokens accepted);
it depends on no latency, so the engine can time the same trajectory under many GPU splits.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from swiftspec.spec import Mode, TreePolicy


class RankTree:
    """A dynamic draft tree whose nodes are draft ranks.

    Attributes (one entry per node, index = creation order, node 0 = root):
      parent[i] (root -1), rank[i] (root -1), depth[i] (root 0), cum[i] (cum_logprob, root 0.0),
      expanded[i], children[i] (dict rank -> node index).
    `logq` holds log q[rank] for ranks 0..w-1, shape (w,).
    """

    def __init__(self, logq: np.ndarray, w: int, max_depth: int = 0) -> None:
        self.logq = [float(x) for x in logq[:w]]
        self.w = min(w, len(self.logq))
        self.max_depth = max_depth
        self._reset()

    def _reset(self) -> None:
        self.parent = [-1]
        self.rank = [-1]
        self.depth = [0]
        self.cum = [0.0]
        self.expanded = [False]
        self.children: list[dict[int, int]] = [{}]
        self._frontier = [(-0.0, 0)]  # heap of (-cum_logprob, index) of unexpanded, growable nodes

    def __len__(self) -> int:
        return len(self.parent)

    def _growable(self, i: int) -> bool:
        return self.max_depth <= 0 or self.depth[i] < self.max_depth

    def expand(self) -> int:
        """One draft forward over the <= w best unexpanded nodes; returns how many it forwarded."""
        picked = []
        while self._frontier and len(picked) < self.w:
            _, i = heapq.heappop(self._frontier)
            picked.append(i)
        # children are created in node order, as the runtime does (`DraftTree.next_batch` returns
        # ascending ids): creation order breaks cum_logprob ties later, so it must agree
        picked.sort()
        # hot loop of the planner: bind everything local, append per column
        parent, rank, depth, cum, expanded, children = (
            self.parent, self.rank, self.depth, self.cum, self.expanded, self.children)
        frontier, logq, w, push = self._frontier, self.logq, self.w, heapq.heappush
        ranks = range(w)
        for i in picked:
            expanded[i] = True
            base, dep = cum[i], depth[i] + 1
            j0 = len(parent)
            cs = [base + lq for lq in logq[:w]]
            parent.extend([i] * w)
            rank.extend(ranks)
            depth.extend([dep] * w)
            cum.extend(cs)
            expanded.extend([False] * w)
            children.extend({} for _ in ranks)
            children[i] = dict(zip(ranks, range(j0, j0 + w)))
            if self.max_depth <= 0 or dep < self.max_depth:
                for r in ranks:
                    push(frontier, (-cs[r], j0 + r))
        return len(picked)

    def select(self, bs: int) -> set[int]:
        """The `bs` nodes with the highest cum_logprob (ties: earlier-created); contains the root."""
        if len(self.parent) <= bs:
            return set(range(len(self.parent)))
        cum = self.cum
        return set(heapq.nsmallest(bs, range(len(cum)), key=lambda i: (-cum[i], i)))

    def verify(self, selected: set[int], path: np.ndarray, pos: int) -> tuple[int, int]:
        """Greedy verification of `selected` against the rank path from position `pos`.

        Returns (last accepted node, followed nodes); accepted length = followed + 1.
        """
        cur, k = 0, 0
        while True:
            r = int(path[pos + k]) if pos + k < len(path) else -1
            child = self.children[cur].get(r) if r >= 0 else None
            if child is None or child not in selected:
                return cur, k
            cur, k = child, k + 1

    def unexpanded_on_path(self, last: int) -> int:
        """Nodes from the root to `last` (both included) the draft has not forwarded: after a verify
        they are the runtime's *pending* tokens, run in front of the next tree's first forward."""
        n = 0
        while last >= 0:
            n += not self.expanded[last]
            last = self.parent[last]
        return n

    def reroot(self, node: int, limit: int | None = None) -> None:
        """Keep only the subtree under `node` (which becomes the root), renumbered in creation order.

        limit: keep at most this many nodes, the best-first ones (highest cum_logprob, ties to the
        earlier-created), as the runtime does (`DraftTree.reroot(keep=...)`, `TreePolicy.keep_limit`).
        """
        keep = [node]
        stack = [node]
        while stack:
            i = stack.pop()
            for j in self.children[i].values():
                keep.append(j)
                stack.append(j)
        if limit is not None and len(keep) > limit:
            cum = self.cum
            keep = heapq.nsmallest(limit, keep, key=lambda i: (-cum[i], i))
        keep.sort()
        new = {old: k for k, old in enumerate(keep)}
        c0, d0 = self.cum[node], self.depth[node]
        self.parent = [new.get(self.parent[o], -1) if o != node else -1 for o in keep]
        self.rank = [self.rank[o] if o != node else -1 for o in keep]
        self.depth = [self.depth[o] - d0 for o in keep]
        self.cum = [self.cum[o] - c0 for o in keep]
        self.expanded = [self.expanded[o] for o in keep]
        self.children = [{r: new[j] for r, j in self.children[o].items() if j in new} for o in keep]
        self._frontier = [
            (-self.cum[k], k) for k in range(len(keep)) if not self.expanded[k] and self._growable(k)
        ]
        heapq.heapify(self._frontier)

    def advance(self, last: int, bonus_rank: int, limit: int | None = None) -> bool:
        """After a verify: re-root at the bonus node (child of `last` with rank `bonus_rank`) if
        the tree holds it (keeping at most `limit` nodes), else start a fresh tree. Returns True
        when the subtree was kept."""
        child = self.children[last].get(bonus_rank) if bonus_rank >= 0 else None
        if child is None:
            self._reset()
            return False
        self.reroot(child, limit)
        return True


class StaticRankTree:
    """A fixed topology (parent index per node, root first, children in draft-rank order).

    The draft fills it level by level: one forward per level over that level's nodes that have
    children. Verification is the same walk as in `RankTree`.
    """

    def __init__(self, topology: tuple[int, ...]) -> None:
        n = len(topology)
        self.children: list[dict[int, int]] = [{} for _ in range(n)]
        self.parent = list(topology)
        depth = [0] * n
        for j in range(1, n):
            p = topology[j]
            self.children[p][len(self.children[p])] = j
            depth[j] = depth[p] + 1
        levels: dict[int, int] = {}
        for i in range(n):
            if self.children[i]:
                levels[depth[i]] = levels.get(depth[i], 0) + 1
        # (forwarded tokens, tree nodes already in the draft cache) per level
        self.forwards = []
        cached = 0
        for lvl in sorted(levels):
            self.forwards.append((levels[lvl], cached))
            cached += levels[lvl]
        self.size = n
        self.expanded = [bool(c) for c in self.children]  # a node is forwarded iff it has children

    verify = RankTree.verify
    unexpanded_on_path = RankTree.unexpanded_on_path


@dataclass(frozen=True)
class IterationTrace:
    """What one iteration did, independent of time.

    pre:      draft forwards done before the subtree is sent (serial/chain: all of them; async:
              the immediate expansions of a tree smaller than bs), each as (tokens forwarded,
              tree nodes before the forward). A fresh tree's first forward also runs the
              previous verify's *pending* tokens: accepted nodes the draft never forwarded
              (runtime `ModelRunner.pending`), so its tokens are 1 + pending.
    overlap:  draft forwards done while the target verifies (async only), same layout.
    sent:     tree nodes the target verifies (<= bs, root included).
    accepted: tokens produced (followed nodes + bonus).
    tree_size: draft tree nodes when the subtree was sent.
    kept:     draft tree nodes kept by the re-root after this verify (0 = fresh tree).
    """

    pre: tuple[tuple[int, int], ...]
    overlap: tuple[tuple[int, int], ...]
    sent: int
    accepted: int
    tree_size: int
    kept: int


def request_trajectory(
    mode: Mode, policy: TreePolicy, logq: np.ndarray, path: np.ndarray, max_new_tokens: int
) -> list[IterationTrace]:
    """Replay one request until at least `max_new_tokens` tokens are produced.

    serial/chain start a fresh tree at every bonus token (we do not keep the subtree under it);
    async follows Algorithm 1 and keeps it, at most `policy.keep_limit` nodes (best-first), as
    the runtime does. `logq`: log draft probability by rank, shape (>= w,). Step for step what
    the runtime (`generate.generate`, `engine._async_draft`) does: same forwards, same tokens per
    forward (pending tokens included), same nodes sent.
    """
    out: list[IterationTrace] = []
    pos = 0
    if mode is Mode.autoregressive:
        n = max_new_tokens
        return [IterationTrace((), (), 1, 1, 1, 0)] * n
    if policy.kind == "static":
        tree = StaticRankTree(policy.topology)
        sel = set(range(tree.size))
        pending = 0
        while pos < max_new_tokens:
            last, k = tree.verify(sel, path, pos)
            out.append(IterationTrace(_with_pending(tree.forwards, pending), (), tree.size, k + 1, tree.size, 0))
            pending = tree.unexpanded_on_path(last)
            pos += k + 1
        return out
    if mode in (Mode.serial, Mode.chain):
        # a fresh tree every iteration: its shape and selection never change, only the path does
        tree = RankTree(logq, policy.w, policy.max_depth)
        pre: list[tuple[int, int]] = []
        for _ in range(policy.d):
            if not _expand_once(tree, pre, 0):
                break
        sel = tree.select(policy.bs)
        pending = 0
        while pos < max_new_tokens:
            last, k = tree.verify(sel, path, pos)
            out.append(IterationTrace(_with_pending(pre, pending), (), len(sel), k + 1, len(tree), 0))
            pending = tree.unexpanded_on_path(last)
            pos += k + 1
        return out
    # async (Algorithm 1)
    tree = RankTree(logq, policy.w, policy.max_depth)
    pending = 0
    while pos < max_new_tokens:
        pre: list[tuple[int, int]] = []
        while len(tree) < policy.bs and _expand_once(tree, pre, pending):
            pending = 0
        size_sent = len(tree)
        sel = tree.select(policy.bs)
        overlap: list[tuple[int, int]] = []
        for _ in range(policy.d):
            if not _expand_once(tree, overlap, pending):
                break
            pending = 0
        last, k = tree.verify(sel, path, pos)
        bonus = int(path[pos + k]) if pos + k < len(path) else -1
        unexpanded = tree.unexpanded_on_path(last)
        kept = len(tree) if tree.advance(last, bonus, policy.keep_limit) else 0
        pending = 0 if kept else unexpanded
        out.append(IterationTrace(tuple(pre), tuple(overlap), len(sel), k + 1, size_sent, kept))
        pos += k + 1
    return out


def _expand_once(tree: RankTree, log: list[tuple[int, int]], pending: int) -> bool:
    """One draft forward, logged as (tokens incl. `pending`, tree size before); False when nothing
    is left to expand."""
    size = len(tree)
    f = tree.expand()
    if f:
        log.append((f + pending, size))
    return f > 0


def _with_pending(forwards, pending: int) -> tuple[tuple[int, int], ...]:
    """`forwards` with `pending` tokens added to the first one (see IterationTrace.pre)."""
    fw = tuple(forwards)
    if not pending or not fw:
        return fw
    return ((fw[0][0] + pending, fw[0][1]), *fw[1:])
