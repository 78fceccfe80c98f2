"""Verification: which drafted tokens the target accepts, and its next (bonus) token.

A `Verifier` looks at the target's logits over the selected subtree (one row per selected node:
the target's next-token distribution at that node) and returns a `Verdict`. Greedy verification
is implemented; stochastic verification (SpecInfer / Sequoia: accept a child with probability
min(1, p/q), else resample from the residual) fits the same protocol — it would additionally read
the draft's distributions at the selected nodes (kept by the tree when it grows) and own a
`torch.Generator`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from swiftspec.runtime.tree import DraftTree


@dataclass(frozen=True)
class Verdict:
    """Result of one verify.

    path:   tree node ids from the root to the last accepted node (root included).
    bonus:  the target's token after the last accepted node: the next tree's root.
    """

    path: list[int]
    bonus: int

    @property
    def accepted_length(self) -> int:
        """Tokens this verify produced: accepted drafted tokens + the bonus token."""
        return len(self.path)

    def new_tokens(self, tree: DraftTree) -> list[int]:
        """The produced tokens in order (the root was produced by the previous verify)."""
        return [tree.tokens[n] for n in self.path[1:]] + [self.bonus]


class Verifier(Protocol):
    def verify(self, tree: DraftTree, selected: Sequence[int], target_logits: torch.Tensor) -> Verdict:
        """target_logits: (len(selected), vocab), row i = target's logits at node selected[i]."""
        ...


class GreedyVerifier:
    """Follow the target's argmax from the root while the matching child was verified."""

    def verify(self, tree: DraftTree, selected: Sequence[int], target_logits: torch.Tensor) -> Verdict:
        argmax = target_logits.argmax(dim=-1).tolist()  # one device sync per verify
        row = {n: i for i, n in enumerate(selected)}
        node, path = 0, [0]
        while True:
            child = tree.child_with_token(node, argmax[row[node]])
            if child is None or child not in row:
                return Verdict(path=path, bonus=int(argmax[row[node]]))
            node = child
            path.append(node)
