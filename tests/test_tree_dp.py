import numpy as np
import pytest

from swiftspec.sim.tree_dp import (
    best_static_tree,
    best_tree_for_budget,
    brute_force_best_tree,
    expected_accepted,
)
from swiftspec.spec import TreePolicy, UserError


def _random_decreasing(seed: int, k: int = 8) -> list[float]:
    rng = np.random.default_rng(seed)
    v = np.sort(rng.dirichlet(np.ones(k + 1)))[::-1]  # k ranks + the miss mass, sums to 1
    return [float(x) for x in v[:k]]


def _depth(topology) -> int:
    depth = [0] * len(topology)
    for i, parent in enumerate(topology):
        if i:
            depth[i] = depth[parent] + 1
    return max(depth)


@pytest.mark.parametrize("seed", range(4))
def test_dp_equals_brute_force(seed):
    p = _random_decreasing(seed)
    for n in range(1, 8):
        for max_depth in (None, 1, 2, 3):
            value, topo = best_static_tree(p, n, max_depth)
            brute, _ = brute_force_best_tree(p, n, max_depth)
            assert value == pytest.approx(brute, abs=1e-12), (n, max_depth)
            assert len(topo) == n and topo[0] == -1
            assert all(0 <= parent < i for i, parent in enumerate(topo) if i)
            assert expected_accepted(p, topo) == pytest.approx(value, abs=1e-12)
            if max_depth is not None:
                assert _depth(topo) <= max_depth
            TreePolicy(bs=n, w=1, d=1, kind="static", topology=topo).validate()


def test_closed_forms():
    p = [0.6, 0.3, 0.05]
    # n = 2: one child of rank 0
    assert best_static_tree(p, 2)[0] == pytest.approx(1.6)
    # depth 1 forces a star: 1 + sum of the top n-1 ranks
    value, topo = best_static_tree(p, 4, max_depth=1)
    assert value == pytest.approx(1.95) and topo == (-1, 0, 0, 0)
    # p0 = 1: the chain accepts everything
    value, topo = best_static_tree([1.0, 0.0], 6)
    assert value == pytest.approx(6.0) and topo == (-1, 0, 1, 2, 3, 4)


def test_large_tree_is_fast_and_monotone_in_size():
    p = [0.78 * 0.2**k for k in range(16)]
    values = [best_static_tree(p, n)[0] for n in (8, 16, 32, 64, 128)]
    assert all(a < b for a, b in zip(values, values[1:]))
    assert values[-1] < 1 / (1 - sum(p)) + 1e-9  # bounded by the infinite-tree limit


def test_budget_picks_best_rate():
    p = _random_decreasing(7)
    sizes = [2, 4, 8, 16]

    def verify(n: int) -> float:
        return 10.0 + 0.5 * n

    choice = best_tree_for_budget(p, sizes, verify, draft_ms_per_level=1.0)
    rates = [
        best_static_tree(p, n, d)[0] / (verify(n) + d * 1.0) for n in sizes for d in range(1, n)
    ]
    assert choice.tokens_per_ms == pytest.approx(max(rates))
    assert expected_accepted(p, choice.topology) == pytest.approx(choice.expected)
    assert _depth(choice.topology) <= choice.depth


def test_bad_input():
    with pytest.raises(UserError):
        best_static_tree([0.5], 0)
    with pytest.raises(UserError):
        best_static_tree([1.5], 3)
