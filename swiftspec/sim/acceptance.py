"""Acceptance model: how many drafted tokens the target accepts, in the *rank view* (docs/design.md).

A child is named by its draft rank (0 = the draft's most likely token). The target's greedy path
is a sequence of ranks r_0, r_1, ... (-1: not among the draft's candidates). A tree, given as the
set of rank paths from its root, accepts while the next rank is a child in the tree:

    follow(tree_paths, path, i) = m   (m followed nodes; accepted length m + 1 with the bonus)

and the next iteration's root is the bonus token, whose successor is path[i + m + 1].

Sequoia's positional model makes every r_j independent with P(r = k) = positional[k], so a static
tree accepts 1 + Σ_{non-root nodes} Π positional[rank] along the node's path in expectation.
Measured profiles replay the recorded traces instead (exact for static rank trees).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import numpy as np

from swiftspec.spec import AcceptanceProfile, SourceRef, UserError, file_sha256

# SwiftSpec Table 7 (Qwen2-72B target, Qwen2-1.5B draft, bs = w = 8): mean accepted length per
# dataset (Alpaca, GSM8K, HumanEval, MT-Bench, Natural Questions, CNN/DailyMail).
TABLE7_SERIAL = (3.28, 4.2, 4.04, 3.42, 3.12, 3.72)
TABLE7_ASYNC = (2.92, 3.78, 3.92, 3.11, 2.74, 3.56)


def follow(tree_paths: set[tuple[int, ...]], path: np.ndarray, i: int) -> int:
    """Nodes of the tree followed by the target path from index `i` (accepted length - 1).

    tree_paths: rank paths from the root of every non-root node in the verified subtree, e.g.
    {(0,), (1,), (0, 0)}; path: the target's ranks (int, -1 = miss); i: index of the rank of
    the token after the root. Stops at a miss, a rank not in the tree, or the end of `path`.
    """
    m, prefix = 0, ()
    while i + m < len(path):
        prefix = (*prefix, int(path[i + m]))
        if prefix not in tree_paths:
            break
        m += 1
    return m


def rank_children(topology: Sequence[int]) -> np.ndarray:
    """children[node, rank] = index of that node's child of draft rank `rank`, or -1.

    topology: parent index per node (root first, parent -1), children in rank order.
    Shape: (len(topology), max children of any node, at least 1).
    """
    n = len(topology)
    kids: list[list[int]] = [[] for _ in range(n)]
    for node, parent in enumerate(topology):
        if node > 0:
            if not 0 <= parent < node:
                raise UserError(f"topology: parent {parent} of node {node} does not precede it")
            kids[parent].append(node)
    table = np.full((n, max(1, max(len(k) for k in kids))), -1, dtype=np.int64)
    for node, k in enumerate(kids):
        table[node, : len(k)] = k
    return table


def follow_children(children: np.ndarray, path: np.ndarray, i: int, root: int = 0) -> int:
    """`follow` for a tree given as a rank_children table (faster for static trees)."""
    m, node, width = 0, root, children.shape[1]
    while i + m < len(path):
        r = int(path[i + m])
        if not 0 <= r < width or children[node, r] < 0:
            break
        node = int(children[node, r])
        m += 1
    return m


def ml_tree_paths(q: Sequence[float], bs: int, w: int, expansions: int, max_depth: int = 0) -> list[tuple[int, ...]]:
    """Rank paths of the `bs` nodes a dynamic max-likelihood tree sends to the target.

    q: draft probability of the rank-k child (same at every node). Grows `expansions` expansions
    from a fresh root (each: the up-to-`w` unexpanded nodes with highest cum_logprob, ties to the
    earlier-created, skipping nodes at max_depth; each gets children of ranks 0..w-1), then keeps
    the best `bs` nodes. Returned root first, in selection order; the root is the empty path ().
    """
    if w > len(q):
        raise UserError(f"draft_prob_by_rank has {len(q)} ranks, tree width w={w} needs {w}")
    logq = [math.log(x) if x > 0 else -math.inf for x in q[:w]]
    nodes = [((), 0.0)]  # (rank path, cum_logprob), index = creation order
    frontier = [(-0.0, 0)]  # heap of (-cum_logprob, created) over unexpanded nodes
    for _ in range(expansions):
        picked = []
        while frontier and len(picked) < w:
            _, idx = heapq.heappop(frontier)
            if max_depth and len(nodes[idx][0]) >= max_depth:
                continue  # never expandable
            picked.append(idx)
        if not picked:
            break
        picked.sort()  # children created in node order, as RankTree and the runtime do (ties)
        for idx in picked:
            path, lp = nodes[idx]
            for r in range(w):
                nodes.append(((*path, r), lp + logq[r]))
                heapq.heappush(frontier, (-(lp + logq[r]), len(nodes) - 1))
    order = sorted(range(len(nodes)), key=lambda k: (-nodes[k][1], k))[:bs]
    return [nodes[k][0] for k in order]


def expected_accepted_paths(positional: Sequence[float], paths: Sequence[tuple[int, ...]]) -> float:
    """1 + Σ over non-root rank paths of Π positional[rank] (ranks past the vector count 0)."""
    total = 1.0
    for path in paths:
        if path:
            total += math.prod(positional[r] if r < len(positional) else 0.0 for r in path)
    return total


def _topology_paths(topology: Sequence[int]) -> list[tuple[int, ...]]:
    children = rank_children(topology)
    paths: list[tuple[int, ...]] = [()] * len(topology)
    for node in range(len(topology)):
        for r, c in enumerate(children[node]):
            if c >= 0:
                paths[c] = (*paths[node], r)
    return paths


class AcceptanceModel:
    """Acceptance of one draft/target pair from an AcceptanceProfile (see module docstring)."""

    def __init__(self, profile: AcceptanceProfile):
        profile.validate()
        self.profile = profile
        self.label = profile.label
        self.positional = np.asarray(profile.positional, dtype=float)
        self.draft_prob_by_rank = np.asarray(profile.draft_prob_by_rank, dtype=float)
        self._traces = [np.asarray(t, dtype=np.int64) for t in profile.traces if len(t) > 0]

    def child_logprobs(self, w: int) -> np.ndarray:
        """log q[0..w-1]: cum_logprob increments of a node's children by rank. Shape (w,)."""
        if w > len(self.draft_prob_by_rank):
            raise UserError(
                f"acceptance profile ({self.label}) has draft probabilities for {len(self.draft_prob_by_rank)} "
                f"ranks; tree width w={w} needs {w}"
            )
        with np.errstate(divide="ignore"):
            return np.log(self.draft_prob_by_rank[:w])

    def expected_accepted_static(self, topology: Sequence[int]) -> float:
        """Sequoia's expected accepted length of a static tree (bonus included)."""
        return expected_accepted_paths(self.positional, _topology_paths(topology))

    def expected_accepted_dynamic(self, bs: int, w: int, expansions: int, max_depth: int = 0) -> float:
        """Expected accepted length of a fresh max-likelihood tree (ml_tree_paths) under `positional`."""
        return expected_accepted_paths(
            self.positional, ml_tree_paths(self.draft_prob_by_rank, bs, w, expansions, max_depth)
        )

    def request_paths(self, n: int, length: int, seed: int) -> list[np.ndarray]:
        """`n` target rank paths of `length` (int64, -1 = miss), one per simulated request.

        With traces: request j replays trace j mod (number of traces), continued by the following
        traces when shorter than `length`. Without: i.i.d. ranks, P(k) = positional[k],
        P(-1) = 1 - Σ positional, from numpy's default_rng(seed).
        """
        if self._traces:
            out = []
            for j in range(n):
                parts, have, k = [], 0, j
                while have < length:
                    t = self._traces[k % len(self._traces)]
                    parts.append(t)
                    have += len(t)
                    k += 1
                out.append(np.concatenate(parts)[:length] if parts else np.zeros(0, dtype=np.int64))
            return out
        rng = np.random.default_rng(seed)
        probs = np.append(self.positional, max(0.0, 1.0 - self.positional.sum()))
        ranks = np.append(np.arange(len(self.positional)), -1)
        return [rng.choice(ranks, size=length, p=probs / probs.sum()) for _ in range(n)]

    def accepted_along(self, path: np.ndarray, start: int, tree_children: np.ndarray, root: int = 0) -> int:
        """Accepted length (followed nodes + 1) of a tree given as a rank_children table."""
        return follow_children(tree_children, path, start, root) + 1


# --------------------------------------------------------------------------------------------
# synthetic profiles


def _geometric(first: float, ratio: float, k: int) -> list[float]:
    return [first * ratio**i for i in range(k)]


def fit_synthetic_to_accepted_length(
    target_mean: float,
    bs: int,
    w: int,
    expansions: int | None = None,
    ranks: int = 16,
    positional_ratio: float = 0.2,
    draft_top1: float = 0.6,
    draft_ratio: float = 0.3,
    name: str = "synthetic",
    notes: str = "",
) -> AcceptanceProfile:
    """A synthetic profile whose dynamic tree (bs, w) accepts `target_mean` tokens per verify.

    draft_prob_by_rank q_k = draft_top1 · draft_ratio^k and positional p_k = a · positional_ratio^k
    (k < ranks); `a` is found by bisection so that the expected accepted length of the fresh
    max-likelihood tree (ml_tree_paths with `expansions`, default bs: enough to complete it) equals
    target_mean. Raises UserError when no a with Σp <= 1 reaches it.
    """
    q = _geometric(draft_top1, draft_ratio, ranks)
    paths = ml_tree_paths(q, bs, w, expansions if expansions is not None else bs)
    a_max = (1 - positional_ratio) / (1 - positional_ratio**ranks)  # Σp = 1

    def mean(a: float) -> float:
        return expected_accepted_paths(_geometric(a, positional_ratio, ranks), paths)

    if not 1.0 <= target_mean <= mean(a_max):
        raise UserError(
            f"cannot fit mean accepted length {target_mean} with bs={bs}, w={w}: reachable 1..{mean(a_max):.3f}"
        )
    lo, hi = 0.0, a_max
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mean(mid) < target_mean else (lo, mid)
    p = _geometric(lo, positional_ratio, ranks)
    return AcceptanceProfile(
        positional=p,
        draft_prob_by_rank=q,
        top_k=ranks,
        meta={
            "source": "synthetic",
            "name": name,
            "fit": {
                "target_mean": target_mean, "bs": bs, "w": w, "expansions": expansions or bs,
                "positional": f"{lo:.6f} * {positional_ratio}^k",
                "draft_prob_by_rank": f"{draft_top1} * {draft_ratio}^k",
                "achieved_mean": mean(lo),
            },
            "notes": notes,
        },
    )


def bundled_acceptance_path() -> Path:
    return Path(str(resources.files("swiftspec") / "data" / "acceptance" / "qwen2-72b-table7.json"))


def build_qwen2_72b_table7() -> AcceptanceProfile:
    """The default synthetic profile: fitted to SwiftSpec Table 7's serial mean (bs = w = 8)."""
    serial, asynch = sum(TABLE7_SERIAL) / 6, sum(TABLE7_ASYNC) / 6
    prof = fit_synthetic_to_accepted_length(
        round(serial, 4), bs=8, w=8, name="qwen2-72b-table7",
        notes=(
            "SYNTHETIC, not measured. SwiftSpec (ASPLOS '26) Table 7, Qwen2-72B target / Qwen2-1.5B "
            "draft, bs = w = 8, 8xH800: mean accepted length over Alpaca/GSM8K/HumanEval/MT-Bench/NQ/"
            f"CNN-DM is {serial:.3f} serial ({', '.join(map(str, TABLE7_SERIAL))}) and {asynch:.3f} "
            f"async ({', '.join(map(str, TABLE7_ASYNC))}). The positional vector is fitted so a fresh "
            "max-likelihood tree of 8 nodes grown to completion accepts the serial mean; async should "
            "come out lower in simulation because it verifies trees grown from a stale root."
        ),
    )
    prof.meta.update({"target": "Qwen2-72B", "draft": "Qwen2-1.5B", "paper_serial_mean": serial,
                      "paper_async_mean": asynch, "command": "python -m swiftspec.sim.acceptance"})
    return prof


def default_acceptance() -> tuple[AcceptanceProfile, SourceRef]:
    """The bundled synthetic profile and its provenance (`builtin:qwen2-72b-table7`)."""
    path = bundled_acceptance_path()
    prof = AcceptanceProfile.load(path)
    return prof, SourceRef(path="builtin:qwen2-72b-table7", sha256=file_sha256(path), label=prof.label)


def main() -> None:
    prof = build_qwen2_72b_table7()
    prof.save(bundled_acceptance_path())
    print(f"wrote {bundled_acceptance_path()} ({prof.label})")
    print("positional:", [round(x, 4) for x in prof.positional[:6]], "...")
    print("draft_prob_by_rank:", [round(x, 4) for x in prof.draft_prob_by_rank[:6]], "...")
    print("fit:", prof.meta["fit"])


if __name__ == "__main__":
    main()
