"""Verification: which drafted tokens the target accepts, and its next (bonus) token.

A `Verifier` looks at the target's logits over the selected subtree (one row per selected node:
the target's next-token distribution at that node) and returns a `Verdict`.

`GreedyVerifier` follows the target's argmax. `SamplingVerifier` samples at a temperature: at each
node on the walk it draws the target's token there and moves to the child carrying it, if that
child was verified; the first draw without one is the bonus token. Every produced token is thus a
draw from the target's own distribution, so the output has the distribution of target-only
sampling. The draws are by inverse CDF from one uniform per output position, from a seeded stream,
so with the same seed the output equals target-only sampling (`mode autoregressive`) token for
token, whatever the tree. top-k / top-p (nucleus) truncation reshapes the target's distribution
before the draw, the same at every node in every mode, so the same holds for them. The draft's
distribution is not needed: the trees here are grown deterministically (top-w children), and
for a fixed child set the chance to continue, p(children), is the most any lossless rule can
accept. (SpecInfer's residual resampling is for
children that were themselves sampled from the draft.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from swiftspec.runtime.tree import DraftTree
from swiftspec.spec import SamplingParams


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


class SamplingVerifier:
    """Sample the target as `sampling` says (temperature > 0) and walk the tree along the draws
    (module docstring).

    Stateful: it counts the tokens its verdicts produced, so a node at depth k (root 0) is the
    output position `produced + k` and takes that position's uniform from the stream seeded by
    `sampling.seed`. Use one verifier per generation."""

    def __init__(self, sampling: SamplingParams):
        if sampling.greedy:
            raise ValueError("SamplingVerifier needs a temperature > 0 (0 is greedy: GreedyVerifier)")
        self.sampling = sampling
        self.produced = 0
        self._gen = torch.Generator().manual_seed(sampling.seed)
        self._u: list[float] = []

    def uniform(self, position: int) -> float:
        """The uniform of output position `position` (0 = the first generated token), in [0, 1)."""
        while len(self._u) <= position:  # drawn in blocks; the stream does not depend on the block size
            self._u.extend(torch.rand(64, generator=self._gen, dtype=torch.float64).tolist())
        return self._u[position]

    def verify(self, tree: DraftTree, selected: Sequence[int], target_logits: torch.Tensor) -> Verdict:
        u = torch.tensor([self.uniform(self.produced + tree.depths[n]) for n in selected], dtype=torch.float64)
        sp = self.sampling
        drawn = sample_by_inverse_cdf(target_logits, u.to(target_logits.device), float(sp.temperature),
                                      int(sp.top_k), float(sp.top_p))
        drawn = drawn.tolist()  # one device sync per verify
        row = {n: i for i, n in enumerate(selected)}
        node, path = 0, [0]
        while True:
            child = tree.child_with_token(node, drawn[row[node]])
            if child is None or child not in row:
                self.produced += len(path)
                return Verdict(path=path, bonus=int(drawn[row[node]]))
            node = child
            path.append(node)


def truncated_probs(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """softmax(logits / temperature) restricted to the top-k tokens and then to the nucleus of mass
    top_p, renormalised. logits: (rows, vocab); returns (rows, vocab) float32.

    top_k keeps every token whose logit ties the k-th largest. top_p keeps the most probable tokens
    up to and including the first one at which their sum reaches top_p (at least one token), as
    Hugging Face's TopPLogitsWarper does, computed after top-k."""
    z = logits.float() / temperature
    vocab = z.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(z, top_k, dim=-1).values[:, -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    probs = torch.softmax(z, dim=-1)
    if top_p < 1:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        before = sorted_p.double().cumsum(dim=-1) - sorted_p.double()  # mass of the more probable tokens
        drop_sorted = before >= top_p  # the first token reaching top_p is kept; the top token always is
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def sample_by_inverse_cdf(logits: torch.Tensor, u: torch.Tensor, temperature: float, top_k: int = 0,
                          top_p: float = 1.0) -> torch.Tensor:
    """Token ids drawn from softmax(logits / temperature), truncated to top_k / top_p
    (`truncated_probs`), one per row, by inverse CDF in vocabulary order.

    logits: (rows, vocab), any float dtype (softmax in float32); u: (rows,) uniforms in [0, 1).
    Returns (rows,) int64: the first token whose cumulative probability exceeds u. The cumulative
    sum is float64: over a 128k vocabulary a float32 one drifts by ~1e-5, a bias on rare tokens."""
    probs = truncated_probs(logits, temperature, top_k, top_p)
    cdf = probs.double().cumsum(dim=-1)
    # scale u by the row's total rather than trusting the cumsum to end at exactly 1.0
    idx = torch.searchsorted(cdf, (u.to(cdf.dtype) * cdf[:, -1]).unsqueeze(-1), right=True).squeeze(-1)
    # u * total may round up to total: then take the last token with mass, never a truncated one
    last = probs.shape[-1] - 1 - (probs > 0).flip(-1).int().argmax(dim=-1)
    return torch.minimum(idx, last)
