"""Synthetic acceptance: random weights at real shapes, accept decisions replayed from a profile.

Random weights say nothing about acceptance, so a latency run replays an `AcceptanceProfile`'s
*rank path*: r_0, r_1, ... = the draft rank of the target's token at each
position (-1 = not among the draft's candidates). Everything else is real: the draft still grows
its tree with its own (random) logits, the target still runs its verify forward and argmax, the
messages and KV moves all happen. Only the walk down the tree reads ranks instead of comparing
tokens:

    at node n, position p: r = path[p]; follow the child of rank r if it was verified;
    otherwise stop; the bonus token is the tree's rank-r child of n when the tree holds one
    (so the draft re-roots there), else a token that is not a child of n (a fresh tree).

The draft tree's *shape* follows the profile too: with `DraftTree.rank_logprobs` = log q[rank]
(`rank_logprobs` below, the profile's `draft_prob_by_rank`), a child's cum_logprob is its parent's
plus log q[its rank], exactly as in the simulator's `RankTree`. Without it a random-weight draft,
whose distribution is nearly flat, grows a different tree (e.g. bs=8 filled with root siblings).

A node's children are kept in draft-rank order (`DraftTree.grow`), and a verified subtree holds a
prefix of every node's children in that order (a lower rank has a higher cum_logprob and is created
first), so "the child of rank r" is `children[n][r]` in the draft's tree and in the target's copy
of the subtree alike.

The rank paths are the simulator's own draws (`swiftspec.run.rank_paths`), handed to the runtime
as plain lists, so a run and its prediction replay the same paths. Outputs of such runs say
`acceptance: synthetic (<profile label>)`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from swiftspec.runtime.tree import DraftTree
from swiftspec.runtime.verify import Verdict
from swiftspec.spec import AcceptanceProfile

NOT_SYNTHETIC = -2  # bonus_rank of a measured (token-compared) verdict


def rank_logprobs(profile: AcceptanceProfile) -> list[float]:
    """log q[rank] for every rank of the profile's `draft_prob_by_rank` (-inf where q = 0).

    Computed as the simulator does (`AcceptanceModel.child_logprobs`, numpy), bit for bit: cum_logprob
    ties are common (q geometric) and are broken by creation order only when the sums are equal."""
    q = np.asarray(profile.draft_prob_by_rank, dtype=float)
    with np.errstate(divide="ignore"):
        return [float(x) for x in np.log(q)]


def outside_token(tree: DraftTree, node: int, preferred: int, vocab: int | None = None) -> int:
    """`preferred` if it is not a child token of `node`, else the smallest token id that is not."""
    taken = {tree.tokens[c] for c in tree.children[node]}
    if preferred not in taken:
        return int(preferred)
    tok = 0
    while tok in taken or (vocab is not None and tok >= vocab):
        tok += 1
    return tok


def resolve_bonus(tree: DraftTree, last: int, rank: int, fallback: int) -> int:
    """The bonus token after accepted node `last` when the target's rank there is `rank`."""
    kids = tree.children[last]
    if 0 <= rank < len(kids):
        return tree.tokens[kids[rank]]
    return outside_token(tree, last, fallback)


class SyntheticVerifier:
    """A `Verifier` that follows a rank path instead of the target's argmax (module docstring).

    path: the request's rank path (list of ints). `pos` advances by the accepted length of every
    verify. `consumed[i]` holds the ranks verify i read (its followed ranks, then the bonus rank),
    so their concatenation is the prefix of `path` the run replayed.
    """

    def __init__(self, path: Sequence[int]):
        self.path = [int(r) for r in path]
        self.pos = 0
        self.consumed: list[list[int]] = []
        self.last_bonus_rank = NOT_SYNTHETIC

    def rank_at(self, p: int) -> int:
        return self.path[p] if p < len(self.path) else -1

    def verify(self, tree: DraftTree, selected: Sequence[int], target_logits: torch.Tensor) -> Verdict:
        """target_logits (len(selected), vocab): its argmax only supplies fallback bonus tokens."""
        argmax = target_logits.argmax(dim=-1).tolist()  # the same device sync a real verify has
        row = {n: i for i, n in enumerate(selected)}
        node, path, ranks = 0, [0], []
        while True:
            r = self.rank_at(self.pos + len(ranks))
            kids = tree.children[node]
            child = kids[r] if 0 <= r < len(kids) else None
            if child is None or child not in row:
                ranks.append(r)
                break
            ranks.append(r)
            node = child
            path.append(node)
        self.pos += len(path)
        self.consumed.append(ranks)
        self.last_bonus_rank = ranks[-1]
        bonus = resolve_bonus(tree, node, ranks[-1], int(argmax[row[node]]))
        return Verdict(path=path, bonus=bonus)

