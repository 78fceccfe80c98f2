"""Sequoia's dynamic program: the static tree of n nodes with the most expected accepted tokens.

Under a positional acceptance vector p (the rank-k child of any node is the target's token with
probability p[k], independently per position), a tree accepts in expectation

    G(T) = Σ_{nodes v, root included} Π_{edges on the root→v path} p[rank]

tokens per verify (the root term 1 is the bonus token). For non-increasing p the best tree gives
each node children of contiguous ranks 0..k-1, so with

    best[d][n]   = max G over trees of n nodes and depth <= d     (best[d][1] = 1)
    forest[b][n] = max Σ_j p[b+j] · best[d-1][m_j] over child subtrees of ranks b, b+1, ...
                   holding n nodes in all          (forest[b][0] = 0)

we get best[d][n] = 1 + forest_d[0][n-1] and forest[b][n] = max_{1<=m<=n} p[b]·best[d-1][m] +
forest[b+1][n-m] — a max-plus convolution per (d, b), vectorised with numpy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from swiftspec.spec import UserError


@dataclass
class _Tables:
    """best[d, n] for d = 0..D, n = 0..N (-inf where impossible) and the argmax sizes to rebuild."""

    best: np.ndarray  # (D+1, N+1)
    choice: list[np.ndarray]  # choice[d][b, n] = size m of the rank-b subtree (0 = no child)
    p: np.ndarray


def _check(p: Sequence[float], n: int) -> np.ndarray:
    arr = np.asarray(p, dtype=float)
    if n < 1:
        raise UserError(f"a tree needs at least one node (the root), got n={n}")
    if arr.ndim != 1 or len(arr) == 0 or np.any(arr < 0) or np.any(arr > 1):
        raise UserError("positional acceptance vector must be probabilities in [0, 1]")
    return arr


def _solve(p: np.ndarray, n_max: int, depth: int) -> _Tables:
    # ranks past the vector have p = 0; they are only needed when the len(p)-ary tree of this
    # depth cannot hold n_max nodes, so pad only then
    capacity = sum(len(p) ** i for i in range(depth + 1)) if len(p) > 1 else depth + 1
    if capacity < n_max:
        p = np.concatenate([p, np.zeros(n_max - 1 - len(p))]) if len(p) < n_max - 1 else p
    k = min(len(p), n_max - 1) if n_max > 1 else 0  # ranks that can ever be used
    neg = -np.inf
    best = np.full((depth + 1, n_max + 1), neg)
    best[:, 1] = 1.0
    choice: list[np.ndarray] = [np.zeros((max(k, 1), n_max + 1), dtype=np.int64)]
    sizes = np.arange(n_max + 1)
    # diff[n, m] = n - m, used to gather forest[b+1][n-m] for every (n, m) at once
    diff = sizes[:, None] - sizes[None, :]
    valid = (diff >= 0) & (sizes[None, :] >= 1)
    for d in range(1, depth + 1):
        forest = np.full(n_max + 1, neg)  # ranks >= k: no children possible
        forest[0] = 0.0
        ch = np.zeros((max(k, 1), n_max + 1), dtype=np.int64)
        for b in range(k - 1, -1, -1):
            fin = np.isfinite(best[d - 1])
            sub = np.full(n_max + 1, neg)  # value of a rank-b child subtree of size m
            sub[fin] = p[b] * best[d - 1][fin]
            cand = np.where(valid, sub[None, :] + forest[np.clip(diff, 0, None)], neg)
            m = np.argmax(cand, axis=1)
            new = cand[sizes, m]
            new[0] = 0.0  # no rank-b child (then none of higher rank either)
            ch[b] = np.where(sizes == 0, 0, m)
            forest = new
        best[d, 1:] = 1.0 + forest[:n_max]
        choice.append(ch)
        if np.array_equal(best[d], best[d - 1]):  # a deeper bound changes nothing from here on
            best[d + 1 :] = best[d]
            choice.extend([ch] * (depth - d))
            break
    return _Tables(best=best, choice=choice, p=p)


def _build(t: _Tables, n: int, d: int) -> tuple[int, ...]:
    """Parent indices in BFS order (parents first, siblings in rank order)."""
    parents = [-1]
    queue = [(0, n, d)]  # (node index, subtree size, depth budget)
    while queue:
        node, size, depth = queue.pop(0)
        rest, b = size - 1, 0
        while rest > 0:
            m = int(t.choice[depth][b, rest])
            parents.append(node)
            queue.append((len(parents) - 1, m, depth - 1))
            rest -= m
            b += 1
    return tuple(parents)


def best_static_tree(p: Sequence[float], n: int, max_depth: int | None = None) -> tuple[float, tuple[int, ...]]:
    """The static tree of exactly `n` nodes (root included) maximising expected accepted length.

    p: positional acceptance vector (non-increasing for the contiguous-rank assumption to be
    optimal). max_depth: deepest level below the root (None: n - 1, i.e. unbounded).
    Returns (expected accepted length with the bonus token, topology as parent indices: root
    first with parent -1, parents before children, each node's children in rank order).
    """
    arr = _check(p, n)
    depth = n - 1 if max_depth is None else min(max_depth, n - 1)
    if depth < 0:
        raise UserError(f"max_depth must be >= 0, got {max_depth}")
    t = _solve(arr, n, depth)
    value = float(t.best[depth, n])
    if not np.isfinite(value):
        raise UserError(f"no tree of {n} nodes fits depth {depth} with {len(arr)} ranks")
    return value, _build(t, n, depth)


def expected_accepted(p: Sequence[float], topology: Sequence[int]) -> float:
    """G(T) for a topology (parent per node, children in rank order), computed directly."""
    value = [1.0] * len(topology)
    nth_child = [0] * len(topology)
    total = 1.0
    for node, parent in enumerate(topology):
        if node == 0:
            continue
        rank = nth_child[parent]
        nth_child[parent] += 1
        value[node] = value[parent] * (p[rank] if rank < len(p) else 0.0)
        total += value[node]
    return total


def _ordered_trees(n: int, depth: int) -> Iterator[list]:
    """Every ordered tree of n nodes and depth <= depth, as nested lists of child subtrees."""
    if n == 1:
        yield []
        return
    if depth == 0:
        return
    yield from _forests(n - 1, depth - 1)


def _forests(n: int, depth: int) -> Iterator[list]:
    if n == 0:
        yield []
        return
    for m in range(1, n + 1):
        for first in _ordered_trees(m, depth):
            for rest in _forests(n - m, depth):
                yield [first, *rest]


def _to_topology(tree: list) -> tuple[int, ...]:
    parents, queue = [-1], [(0, tree)]
    while queue:
        node, kids = queue.pop(0)
        for kid in kids:
            parents.append(node)
            queue.append((len(parents) - 1, kid))
    return tuple(parents)


def brute_force_best_tree(p: Sequence[float], n: int, max_depth: int | None = None) -> tuple[float, tuple[int, ...]]:
    """Same as best_static_tree by enumerating all ordered trees (Catalan(n-1) of them): tests only."""
    arr = _check(p, n)
    depth = n - 1 if max_depth is None else max_depth
    best: tuple[float, tuple[int, ...]] | None = None
    for tree in _ordered_trees(n, depth):
        topo = _to_topology(tree)
        value = expected_accepted(arr, topo)
        if best is None or value > best[0] + 1e-12:
            best = (value, topo)
    if best is None:
        raise UserError(f"no tree of {n} nodes fits depth {depth}")
    return best


@dataclass(frozen=True)
class BudgetChoice:
    """Result of best_tree_for_budget: size, depth, expected accepted length, rate, topology."""

    n: int
    depth: int
    expected: float
    tokens_per_ms: float
    topology: tuple[int, ...]


def best_tree_for_budget(
    p: Sequence[float],
    sizes: Sequence[int],
    verify_ms: Callable[[int], float],
    draft_ms_per_level: float,
) -> BudgetChoice:
    """Sequoia's size/depth choice: maximise G(n, d) / (verify_ms(n) + d · draft_ms_per_level).

    sizes: candidate tree sizes n (root included); verify_ms(n): target time to verify n tokens;
    draft_ms_per_level: draft time to fill one level of the static tree.
    """
    if not sizes:
        raise UserError("best_tree_for_budget needs at least one tree size")
    arr = _check(p, max(sizes))
    n_max = max(sizes)
    t = _solve(arr, n_max, n_max - 1)
    best: BudgetChoice | None = None
    for n in sorted(set(sizes)):
        v_ms = verify_ms(n)
        for d in range(0, n):
            g = float(t.best[d, n])
            if not np.isfinite(g):
                continue
            rate = g / (v_ms + d * draft_ms_per_level)
            if best is None or rate > best.tokens_per_ms:
                best = BudgetChoice(n=n, depth=d, expected=g, tokens_per_ms=rate, topology=())
    assert best is not None
    return BudgetChoice(best.n, best.depth, best.expected, best.tokens_per_ms, _build(t, best.n, best.depth))
