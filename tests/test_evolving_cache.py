"""KV compaction: after any accept pattern, the cache equals one rebuilt from scratch.

A real tiny model drafts random trees; random verdicts (random accepted paths, bonus inside or
outside the tree) are committed with `reroot_draft` / `ModelRunner.commit`. The reference cache
is built by a fresh runner that prefills the verified sequence and then forwards the surviving
tree's nodes in one pass with a mask built by brute force from the parent links.
"""

from __future__ import annotations

import random

import pytest
import torch

from swiftspec.runtime.decoder import ModelRunner, reroot_draft
from swiftspec.runtime.tree import DraftTree
from swiftspec.runtime.verify import Verdict
from swiftspec.runtime.weights import load_model
from swiftspec.spec import TreePolicy

MAX_LEN = 96


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def rebuilt(model, verified_in_cache: list[int], tree: DraftTree) -> ModelRunner:
    """A fresh runner holding `verified_in_cache` as prefix and `tree`'s expanded nodes after it."""
    ref = ModelRunner(model, MAX_LEN)
    ref.prefill(verified_in_cache)
    by_slot = sorted((tree.slots[i], i) for i in range(len(tree)) if tree.expanded(i))
    if by_slot:
        nodes = [i for _, i in by_slot]
        mask = torch.zeros(len(nodes), len(nodes), dtype=torch.bool)
        for r, i in enumerate(nodes):
            for c, j in enumerate(nodes):
                a = i
                while a >= 0 and a != j:  # is j an ancestor of i (or i itself)?
                    a = tree.parents[a]
                mask[r, c] = a == j
        ref.forward_tree([tree.tokens[i] for i in nodes], [tree.depths[i] for i in nodes], list(range(len(nodes))), mask)
    return ref


def assert_same_cache(runner: ModelRunner, ref: ModelRunner, n_slots: int) -> None:
    assert runner.prefix_len == ref.prefix_len
    got, want = runner.cache.kv[:, :, :, :n_slots], ref.cache.kv[:, :, :, :n_slots]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert want.abs().max() > 0.1  # a real comparison, not zeros against zeros


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("seed", range(3))
def test_draft_cache_after_random_accepts(make_checkpoint, arch: str, seed: int) -> None:
    model = load_model(make_checkpoint(arch))
    rng = random.Random(seed)
    policy = TreePolicy(bs=8, w=3, d=3)
    runner = ModelRunner(model, MAX_LEN)
    prompt = [rng.randrange(model.spec.vocab) for _ in range(rng.randint(1, 6))]
    runner.prefill(prompt[:-1])
    tree = DraftTree.fresh(prompt[-1], policy)
    verified = list(prompt)  # the last one is the current root
    for round_ in range(5):
        for _ in range(policy.d):
            tree.expand(runner.forward_tree)
        # mostly accept into the tree's expanded part, so a subtree with KV survives
        grown = [i for i in range(1, len(tree)) if tree.expanded(i)]
        inside = bool(grown) and rng.random() < 0.7
        node = tree.parents[rng.choice(grown)] if inside else rng.randrange(len(tree))
        path = tree.path_to(node)
        if inside:  # bonus inside the tree: its subtree survives, its KV is compacted
            bonus = tree.tokens[rng.choice([c for c in tree.children[node] if tree.expanded(c)])]
        else:
            bonus = rng.choice([t for t in range(model.spec.vocab) if tree.child_with_token(node, t) is None])
        verified += [tree.tokens[n] for n in path[1:]] + [bonus]
        keep = 4 if round_ == 3 else None  # also prune a kept tree
        tree = reroot_draft(runner, tree, Verdict(path, bonus), keep_subtree=True, keep=keep)

        in_cache = verified[: runner.prefix_len]
        assert in_cache + runner.pending == verified[:-1]  # pending: accepted leaves without KV
        assert tree.tokens[0] == verified[-1]
        ref = rebuilt(model, in_cache, tree)
        assert_same_cache(runner, ref, runner.prefix_len + tree.num_slots)


@pytest.mark.parametrize("seed", range(3))
def test_target_commit_after_verify(make_checkpoint, seed: int) -> None:
    """The target verifies a selected subtree, keeps only the accepted path."""
    model = load_model(make_checkpoint("qwen2"))
    rng = random.Random(seed)
    policy = TreePolicy(bs=7, w=3, d=3)
    target = ModelRunner(model, MAX_LEN)
    prompt = [rng.randrange(model.spec.vocab) for _ in range(5)]
    target.prefill(prompt[:-1])
    root, verified = prompt[-1], list(prompt)
    fake = torch.Generator().manual_seed(seed)
    for _ in range(4):
        tree = DraftTree.fresh(root, policy)
        for _ in range(policy.d):  # any tree will do: grow it from random logits
            tree.expand(lambda tokens, *_: torch.randn(len(tokens), model.spec.vocab, generator=fake))
        sel = tree.select(policy.bs)
        target.forward_tree(*tree.verify_inputs(sel))
        path = tree.path_to(rng.choice(sel))
        target.commit([sel.index(n) for n in path])
        root = rng.randrange(model.spec.vocab)
        verified += [tree.tokens[n] for n in path[1:]] + [root]
        ref = ModelRunner(model, MAX_LEN)
        ref.prefill(verified[:-1])
        assert_same_cache(target, ref, target.prefix_len)
