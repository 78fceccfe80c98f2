"""DraftTree: growth, selection, masks, static fill, re-rooting; greedy verification.

No model here: the "draft" is a seeded random function of (node token, depth), so every tree is
reproducible and its expected shape can be recomputed by brute force.
"""

from __future__ import annotations

import math

import pytest
import torch

from swiftspec.runtime.tree import DraftTree
from swiftspec.runtime.verify import GreedyVerifier
from swiftspec.spec import TreePolicy

VOCAB = 50


def fake_draft(seed: int):
    """A forward(tokens, depths, slots, mask) -> logits that depends on (token, depth) only."""

    def forward(tokens, depths, slots, mask):
        rows = []
        for t, d in zip(tokens, depths):
            g = torch.Generator().manual_seed(seed * 100003 + t * 131 + d)
            rows.append(torch.randn(VOCAB, generator=g) * 3)
        return torch.stack(rows)

    return forward


def grow(policy: TreePolicy, rounds: int, seed: int = 0, root: int = 7) -> tuple[DraftTree, list]:
    """A tree after `rounds` expansions, plus every (batch, draft mask) the expansions used."""
    tree = DraftTree.fresh(root, policy)
    fwd = fake_draft(seed)
    masks = []

    def recording(tokens, depths, slots, mask):
        masks.append((list(slots), mask.clone()))
        return fwd(tokens, depths, slots, mask)

    for _ in range(rounds):
        if tree.expand(recording) == 0:
            break
    return tree, masks


def ancestor_closure(parents: list[int]) -> torch.Tensor:
    """(n, n) bool: [i, j] iff j is i or an ancestor of i — by repeated boolean matrix products."""
    n = len(parents)
    step = torch.eye(n, dtype=torch.long)
    for i, p in enumerate(parents):
        if p >= 0:
            step[i, p] = 1
    closure = step.clone()
    for _ in range(n):
        closure = ((closure @ step) > 0).long()
    return closure.bool()


POLICIES = [
    TreePolicy(bs=8, w=2, d=4),
    TreePolicy(bs=12, w=3, d=3),
    TreePolicy(bs=6, w=4, d=5, max_depth=2),
    TreePolicy.chain(4),
]


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.key)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_growth_selection_and_masks(policy: TreePolicy, seed: int) -> None:
    tree, masks = grow(policy, policy.d, seed)
    n = len(tree)
    # growth: first expansion forwards the root only; then up to w nodes per forward
    assert masks[0][0] == [0] and len(masks) <= policy.d
    assert all(len(s) <= policy.w for s, _ in masks)
    expanded = [i for i in range(n) if tree.expanded(i)]
    assert sorted(tree.slots[i] for i in expanded) == list(range(tree.num_slots))
    for i in range(1, n):
        p = tree.parents[i]
        assert tree.expanded(p) and tree.depths[i] == tree.depths[p] + 1 and p < i
        assert tree.cum_logprob[i] <= tree.cum_logprob[p]
    if policy.max_depth:
        assert max(tree.depths) <= policy.max_depth
    # children = the w best tokens of the parent's (log-softmaxed) draft distribution, in rank order
    fwd = fake_draft(seed)
    for p in expanded:
        lp = torch.log_softmax(fwd([tree.tokens[p]], [tree.depths[p]], [0], None)[0], -1)
        top = torch.topk(lp, policy.w)
        assert [tree.tokens[c] for c in tree.children[p]] == top.indices.tolist()
        for c, v in zip(tree.children[p], top.values.tolist()):
            assert math.isclose(tree.cum_logprob[c], tree.cum_logprob[p] + v, rel_tol=1e-9, abs_tol=1e-9)

    # selection: top-bs by (cum desc, id asc), connected, root included, ascending ids
    sel = tree.select(policy.bs)
    brute = sorted(range(n), key=lambda i: (-tree.cum_logprob[i], i))[: policy.bs]
    assert sel == sorted(brute) and sel[0] == 0 and len(sel) == min(policy.bs, n)
    assert all(tree.parents[i] in sel for i in sel[1:])

    # verify mask == ancestor closure restricted to the selection
    closure = ancestor_closure(tree.parents)
    tokens, depths, slots, vmask = tree.verify_inputs(sel)
    assert vmask.shape == (len(sel), len(sel)) and slots == list(range(len(sel)))
    assert torch.equal(vmask, closure[sel][:, sel])
    assert depths == [tree.depths[i] for i in sel] and tokens == [tree.tokens[i] for i in sel]

    # draft masks: row of node i (by its slot) == closure over expanded nodes, in slot columns
    by_slot = {tree.slots[i]: i for i in expanded}
    for slot_list, m in masks:
        width = m.shape[1]
        assert width == max(slot_list) + 1
        for r, s in enumerate(slot_list):
            node = by_slot[s]
            want = torch.tensor([bool(closure[node, by_slot[c]]) for c in range(width)])
            assert torch.equal(m[r], want)


def test_chain_is_a_sequence() -> None:
    tree, masks = grow(TreePolicy.chain(5), 5)
    assert tree.parents == [-1, 0, 1, 2, 3, 4] and tree.depths == list(range(6))
    assert [s for s, _ in masks] == [[0], [1], [2], [3], [4]]
    assert not tree.expanded(5)  # the last drafted token is never forwarded by the draft


@pytest.mark.parametrize(
    "topology", [(-1, 0, 0, 1, 1, 3), (-1, 0, 1, 2, 0, 4, 1, 0), (-1, 0, 0, 0, 1, 1, 2, 4, 4, 7)]
)
def test_static_fill_follows_topology(topology) -> None:
    policy = TreePolicy(bs=len(topology), w=1, d=0, kind="static", topology=topology)
    tree, masks = grow(policy, 20, seed=3)
    assert len(tree) == len(topology)
    # topology index -> tree node; parents map onto the topology's parents
    node_of = {tree.topo[i]: i for i in range(len(tree))}
    assert sorted(node_of) == list(range(len(topology)))
    for t, p in enumerate(topology):
        if p >= 0:
            assert tree.parents[node_of[t]] == node_of[p]
    # the k-th child in the topology is the draft's k-th most likely token
    fwd = fake_draft(3)
    for t in range(len(topology)):
        kids = [c for c, p in enumerate(topology) if p == t]
        if not kids:
            assert not tree.expanded(node_of[t])  # leaves are not forwarded
            continue
        n = node_of[t]
        ranked = torch.topk(fwd([tree.tokens[n]], [tree.depths[n]], [0], None)[0], len(kids)).indices.tolist()
        assert [tree.tokens[node_of[k]] for k in kids] == ranked
    # level by level: one forward per level, each holding exactly that level's inner nodes
    inner_depths = [tree.depths[node_of[t]] for t in range(len(topology)) if t in topology]
    assert len(masks) == len(set(inner_depths))
    assert sorted(tree.select(len(topology))) == list(range(len(tree)))


@pytest.mark.parametrize("seed", range(4))
def test_reroot_keeps_the_subtree(seed: int) -> None:
    policy = TreePolicy(bs=8, w=3, d=4)
    tree, _ = grow(policy, 4, seed)
    g = torch.Generator().manual_seed(seed)
    candidates = [i for i in range(1, len(tree)) if tree.children[i]] or [1]
    node = candidates[int(torch.randint(len(candidates), (1,), generator=g))]
    for keep in (None, 3):
        new, old_slots = tree.reroot(node, keep=keep)
        closure = ancestor_closure(tree.parents)
        members = [i for i in range(len(tree)) if closure[i, node]]
        if keep is not None:
            members = sorted(sorted(members, key=lambda i: (-tree.cum_logprob[i], i))[:keep])
        assert len(new) == len(members)
        for j, old in enumerate(members):
            assert new.tokens[j] == tree.tokens[old]
            assert new.depths[j] == tree.depths[old] - tree.depths[node]
            assert math.isclose(new.cum_logprob[j], tree.cum_logprob[old] - tree.cum_logprob[node], abs_tol=1e-9)
            assert new.parents[j] == (members.index(tree.parents[old]) if j else -1)
            if new.expanded(j):
                assert old_slots[new.slots[j]] == tree.slots[old]  # KV comes from the old slot
            else:
                assert not tree.expanded(old)
        assert old_slots == sorted(old_slots) and new.num_slots == len(old_slots)
        assert sorted(new.slots[j] for j in range(len(new)) if new.expanded(j)) == list(range(new.num_slots))


@pytest.mark.parametrize("seed", range(6))
def test_greedy_verify_follows_the_target(seed: int) -> None:
    policy = TreePolicy(bs=10, w=3, d=4)
    tree, _ = grow(policy, 4, seed)
    sel = tree.select(policy.bs)
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(sel), VOCAB, generator=g)
    # steer the target down a random selected path, then off the tree
    leaf = sel[int(torch.randint(len(sel), (1,), generator=g))]
    path = tree.path_to(leaf)
    row = {n: i for i, n in enumerate(sel)}
    for a, b in zip(path, path[1:]):
        logits[row[a], tree.tokens[b]] = 100.0
    verdict = GreedyVerifier().verify(tree, sel, logits)
    # brute force: walk while the argmax is a selected child
    node, want = 0, [0]
    while True:
        nxt = [c for c in tree.children[node] if c in row and tree.tokens[c] == int(logits[row[node]].argmax())]
        if not nxt:
            break
        node = nxt[0]
        want.append(node)
    assert verdict.path == want and want[: len(path)] == path
    assert verdict.bonus == int(logits[row[want[-1]]].argmax())
    assert verdict.accepted_length == len(want)
    assert verdict.new_tokens(tree) == [tree.tokens[n] for n in want[1:]] + [verdict.bonus]


def test_runner_tree_growth_graph_falls_back_off_cuda(make_checkpoint):
    """tree growth "graph" needs CUDA graphs: on CPU it resolves to torch, and the runner's
    top-k equals `top_logprobs_host` on the same logits."""
    from swiftspec.runtime.decoder import ModelRunner
    from swiftspec.runtime.kernel_config import KernelConfig
    from swiftspec.runtime.tree import top_logprobs_host
    from swiftspec.runtime.weights import load_model

    graph = KernelConfig.resolve("cuda", tree_growth="graph").tree_growth
    assert KernelConfig.resolve("cpu", tree_growth="graph").tree_growth == "torch" and graph == "graph"
    kernels = KernelConfig.resolve("cpu", tree_growth="graph")
    runner = ModelRunner(load_model(make_checkpoint("llama"), kernels=kernels), 32)
    assert runner.tree_growth == "torch"
    runner.prefill([1, 2, 3])
    logits = runner.forward_tree([4, 5], [0, 1], [0, 1], torch.tensor([[True, False], [True, True]]))
    assert runner.top_logprobs(logits, 3) == top_logprobs_host(logits, 3, "torch")
