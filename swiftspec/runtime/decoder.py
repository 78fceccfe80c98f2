"""One side of speculative decoding: a model, its KV cache and the evolving tree cache.

`ModelRunner` owns one `Transformer` and one `KVCache` laid out as

    slots [0, prefix_len)                       verified prefix
    slots [prefix_len, prefix_len + tree_len)   tree region: KV of tree nodes already forwarded

and three operations: `prefill` (append verified tokens), `forward_tree` (run new tree nodes
into the tree region) and `commit` (after a verify: move the accepted path's KV into the prefix
and compact the surviving subtree right behind it, no recompute). The target and the draft both
use it; `reroot_draft` is the draft's side of a commit, where the tree is kept.

Verified tokens whose KV a side has not computed yet (the draft never forwards the leaves of its
last expansion) wait in `pending`; the next `forward_tree` runs them in front of the tree nodes,
in the same forward.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from swiftspec.runtime.graphs import GraphRunner
from swiftspec.runtime.kv_cache import KVCache
from swiftspec.runtime.model import Transformer
from swiftspec.runtime.tree import DraftTree, top_logprobs_host
from swiftspec.runtime.verify import Verdict

PREFILL_CHUNK = 256  # tokens per prefill forward: bounds the (T, max_len) attention mask


class ModelRunner:
    """A model plus its static KV cache and where the verified prefix ends.

    max_len: cache slots (prefix + tree region). vocab_limit: logits are cut to this many
    columns (a draft whose vocabulary is padded beyond the target's must not propose ids the
    target cannot embed). use_graphs: capture CUDA graphs (default: on CUDA devices). max_tree:
    widest tree mask the graphs take (default max_len; see __init__). How `top_logprobs` runs is
    the model's `kernels.tree_growth` ("graph": replays of a captured top-k graph on the draft
    forward's static logits).
    """

    def __init__(
        self,
        model: Transformer,
        max_len: int,
        *,
        vocab_limit: int | None = None,
        use_graphs: bool | None = None,
        max_tree: int | None = None,
    ):
        self.model = model
        self.tree_growth = model.kernels.tree_growth
        self._last_tree: tuple[torch.Tensor, int, int] | None = None  # latest forward_tree: logits, row, replay
        self.device, self.dtype = model.device, model.dtype
        self.max_len = max_len
        self.cache = KVCache(model.spec, model.shard, max_len, self.device, self.dtype)
        self.prefix_len = 0
        self.tree_len = 0  # live KV slots in the tree region
        self.pending: list[int] = []
        self.vocab_limit = vocab_limit
        self.loops: dict = {}  # device loops of this runner as a target (`generate`), by config
        self.graphs = None
        if use_graphs if use_graphs is not None else self.device.type == "cuda":
            # masks may span the whole cache: every tree width and prefill chunk replays a graph.
            # max_tree < max_len: the graphs' attention reads prefix + max_tree keys instead of
            # prefix + max_len (the tree attention kernel masks the whole width); wider masks
            # (e.g. long prefill chunks) then run eagerly
            self.graphs = GraphRunner(model, self.cache, max_tree=min(max_tree or max_len, max_len))

    def reset(self) -> None:
        """Empty the runner for the next prompt, keeping its cache, CUDA graphs and device loops:
        slots beyond prefix_len are never attended, so stale KV there is harmless."""
        self.prefix_len, self.tree_len, self.pending = 0, 0, []

    # ---- the one call into the model ------------------------------------------------------

    def _run(self, tokens: list[int], positions: list[int], slots: list[int], tree_mask: torch.Tensor) -> torch.Tensor:
        """Model forward at the current prefix_len. Returns logits (T, vocab) float32."""
        if self.graphs is not None:  # host inputs: staged in pinned memory, one copy (graphs.py)
            logits = self.graphs.run(tokens, positions, slots, self.prefix_len, tree_mask)
        else:
            dev = self.device
            t = torch.tensor(tokens, dtype=torch.long, device=dev)
            pos = torch.tensor(positions, dtype=torch.long, device=dev)
            sl = torch.tensor(slots, dtype=torch.long, device=dev)
            logits = self.model(t, pos, self.cache, sl, self.prefix_len, tree_mask.to(dev))
        return logits if self.vocab_limit is None else logits[:, : self.vocab_limit]

    def _check_room(self, tree_slots: int) -> None:
        if self.prefix_len + len(self.pending) + tree_slots > self.max_len:
            raise RuntimeError(
                f"KV cache overflow: prefix {self.prefix_len} + pending {len(self.pending)} + tree "
                f"{tree_slots} > {self.max_len} slots"
            )

    # ---- operations -----------------------------------------------------------------------

    def prefill(self, tokens: Sequence[int]) -> None:
        """Append verified tokens to the prefix (causal, in chunks). The tree region is dropped."""
        tokens = [*self.pending, *tokens]
        self.pending, self.tree_len = [], 0
        self._check_room(len(tokens))
        for start in range(0, len(tokens), PREFILL_CHUNK):
            chunk = tokens[start : start + PREFILL_CHUNK]
            n = len(chunk)
            causal = torch.ones(n, n, dtype=torch.bool).tril()
            pos = list(range(self.prefix_len, self.prefix_len + n))
            self._run(chunk, pos, pos, causal)
            self.prefix_len += n

    def forward_tree(
        self, tokens: Sequence[int], depths: Sequence[int], slots: Sequence[int], tree_mask: torch.Tensor
    ) -> torch.Tensor:
        """Run new tree nodes and keep their KV in the tree region.

        tokens, depths, slots: (T,) — slots relative to the tree region; tree_mask (T, N) bool over
        tree slots [0, N) (see `attention.py`). Position of a node = prefix_len + depth.
        Pending verified tokens, if any, run first in the same forward (into the prefix; every
        tree node sees them). Returns logits (T, vocab) float32 of the tree nodes only.
        """
        n_tree = tree_mask.shape[1]
        p = len(self.pending)
        self._check_room(n_tree)
        if p == 0:
            base = self.prefix_len
            logits = self._run(list(tokens), [base + x for x in depths], [base + s for s in slots], tree_mask)
        else:
            assert self.tree_len == 0, "pending tokens exist only in front of a fresh tree"
            base = self.prefix_len + p  # the tree region starts after the pending tokens
            mask = torch.zeros(p + len(tokens), p + n_tree, dtype=torch.bool)
            mask[:p, :p] = torch.ones(p, p, dtype=torch.bool).tril()  # pending: causal chain
            mask[p:, :p] = True  # every tree node follows all pending tokens
            mask[p:, p:] = tree_mask
            chain = list(range(self.prefix_len, base))
            logits = self._run(
                [*self.pending, *tokens],
                chain + [base + x for x in depths],
                chain + [base + s for s in slots],
                mask,
            )[p:]
            self.prefix_len, self.pending = base, []
        self.tree_len = max(self.tree_len, n_tree)
        self._last_tree = (logits, p, self.graphs.replays if self.graphs is not None else 0)
        return logits

    def top_logprobs(self, logits: torch.Tensor, k: int) -> tuple[list[list[float]], list[list[int]]]:
        """Tree growth's top-k of `logits` (T, vocab) as host lists (values (T, k), indices (T, k)),
        what `DraftTree.grow` takes. With tree growth "graph" and `logits` the latest
        `forward_tree`'s graph output: a replay of a captured top-k graph on the static logits
        (`GraphRunner.top_logprobs_host`); else `tree.top_logprobs_host`."""
        last, g = self._last_tree, self.graphs
        if (self.tree_growth == "graph" and g is not None and last is not None and last[0] is logits
                and last[2] == g.replays and g.last_bucket is not None):  # fmt: skip
            out = g.top_logprobs_host(last[1], logits.shape[0], k, self.vocab_limit)
            if out is not None:
                return out
        return top_logprobs_host(logits, k, self.tree_growth)

    def commit(self, path_slots: Sequence[int], keep_slots: Sequence[int] = (), pending: Sequence[int] = ()) -> None:
        """After a verify: accepted KV into the prefix, surviving subtree right behind it.

        path_slots: tree slots of the accepted nodes whose KV this side holds, root first.
        keep_slots: tree slots of the surviving subtree, in their new order (new slot j <-
                    keep_slots[j]).
        pending:    accepted tokens this side has no KV for yet (they follow the path).
        One gather + copy in every layer (`KVCache.move`); everything else in the tree region is
        dropped.
        """
        src = [self.prefix_len + s for s in (*path_slots, *keep_slots)]
        if src != list(range(self.prefix_len, self.prefix_len + len(src))):  # else already in place
            self.cache.move(torch.tensor(src, dtype=torch.long, device=self.device), self.prefix_len)
        self.prefix_len += len(path_slots)
        self.tree_len = len(keep_slots)
        self.pending = [*self.pending, *pending]


def reroot_draft(
    runner: ModelRunner, tree: DraftTree, verdict: Verdict, *, keep_subtree: bool, keep: int | None = None
) -> DraftTree:
    """The draft's commit (evolving tree cache): returns the tree for the next round.

    The accepted path's KV moves into the draft prefix. If `keep_subtree` and the bonus token is
    a child of the last accepted node, the tree is re-rooted there and the KV of its expanded
    nodes is compacted right after the prefix; otherwise a fresh tree starts at the bonus token.
    Accepted nodes the draft never forwarded (leaves) become pending tokens.
    """
    expanded = [n for n in verdict.path if tree.expanded(n)]
    unexpanded = [tree.tokens[n] for n in verdict.path if not tree.expanded(n)]
    bonus_node = tree.child_with_token(verdict.path[-1], verdict.bonus)
    if keep_subtree and bonus_node is not None and not tree.static:
        new_tree, old_slots = tree.reroot(bonus_node, keep=keep)
        assert not unexpanded  # the bonus node's parent was expanded, hence all its ancestors
    else:
        new_tree, old_slots = DraftTree.fresh(verdict.bonus, tree.policy, tree.rank_logprobs), []
    runner.commit([tree.slots[n] for n in expanded], old_slots, pending=unexpanded)
    return new_tree
