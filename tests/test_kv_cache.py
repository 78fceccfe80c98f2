"""KVCache.move (the evolving-tree-cache compaction) and cache rebuild equivalence."""

from __future__ import annotations

import pytest
import torch

from swiftspec.runtime.kv_cache import KVCache
from swiftspec.runtime.weights import load_model
from swiftspec.spec import ModelSpec

SPEC = ModelSpec(name="t", architecture="llama", num_layers=3, hidden=32, num_heads=4, num_kv_heads=2,
                 head_dim=8, ffn=64, vocab=100, qkv_bias=False, tie_embeddings=False)  # fmt: skip


@pytest.mark.parametrize("seed", range(6))
def test_move_equals_gather_and_leaves_other_slots_alone(seed):
    gen = torch.Generator().manual_seed(seed)
    cache = KVCache(SPEC, SPEC.shard(1), 40, "cpu", torch.float32)
    cache.kv.copy_(torch.randn(cache.kv.shape, generator=gen))
    before = cache.kv.clone()
    n = int(torch.randint(1, 15, (1,), generator=gen))
    dst = int(torch.randint(0, 40 - n + 1, (1,), generator=gen))
    # sources drawn around the destination so that they overlap it (the compaction case)
    src = torch.randperm(40, generator=gen)[:n] if seed % 2 else torch.arange(dst, dst + n).flip(0)
    cache.move(src, dst)
    for i in range(n):  # brute force, slot by slot, from the untouched copy
        assert torch.equal(cache.k[:, :, dst + i], before[0][:, :, int(src[i])])
        assert torch.equal(cache.v[:, :, dst + i], before[1][:, :, int(src[i])])
    untouched = torch.ones(41, dtype=torch.bool)
    untouched[dst : dst + n] = False
    assert torch.equal(cache.kv[..., untouched, :], before[..., untouched, :])


def test_move_rejects_out_of_range_and_clone_is_independent():
    cache = KVCache(SPEC, SPEC.shard(1), 8, "cpu", torch.float32)
    with pytest.raises(ValueError):
        cache.move(torch.arange(3), 6)
    cache.kv.normal_()
    copy = cache.clone()
    assert torch.equal(copy.kv, cache.kv)
    copy.kv.zero_()
    assert cache.kv.abs().sum() > 0
    assert cache.k.shape == (3, 2, 9, 8) and cache.scratch_slot == 8


def test_compacted_cache_equals_rebuilt_cache(make_checkpoint):
    """Verify a tree, move the accepted path into the prefix and the surviving subtree behind it:
    the cache (and the next forward's logits) equal those of a cache rebuilt from scratch."""
    model = load_model(make_checkpoint("llama"))
    gen = torch.Generator().manual_seed(7)
    p = 6
    prefix = torch.randint(0, 256, (p,), generator=gen)
    # tree: 0 root; 1,2 children of 0; 3,4 of 1; 5 of 3; 6 of 2; 7 of 5
    parents = [-1, 0, 0, 1, 1, 3, 2, 5]
    n = len(parents)
    mask = torch.zeros(n, n, dtype=torch.bool)
    depth = torch.zeros(n, dtype=torch.long)
    for i, q in enumerate(parents):
        mask[i, i] = True
        if q >= 0:
            mask[i] |= mask[q]
            depth[i] = depth[q] + 1
    toks = torch.randint(0, 256, (n,), generator=gen)
    cache = KVCache(model.spec, model.shard, 32, "cpu", torch.float32)
    model(prefix, torch.arange(p), cache, torch.arange(p), 0, torch.ones(p, p, dtype=torch.bool).tril())
    model(toks, p + depth, cache, p + torch.arange(n), p, mask)

    path = [0, 1, 3]  # accepted; the surviving subtree is node 3's descendants: 5, 7
    survivors = [5, 7]
    cache.move(p + torch.tensor(path + survivors), p)
    new_p = p + len(path)

    seq = torch.cat([prefix, toks[path]])
    fresh = KVCache(model.spec, model.shard, 32, "cpu", torch.float32)
    t = len(seq)
    model(seq, torch.arange(t), fresh, torch.arange(t), 0, torch.ones(t, t, dtype=torch.bool).tril())
    k_err = (cache.k[:, :, :new_p] - fresh.k[:, :, :new_p]).abs().max() / fresh.k[:, :, :new_p].abs().max()
    v_err = (cache.v[:, :, :new_p] - fresh.v[:, :, :new_p]).abs().max() / fresh.v[:, :, :new_p].abs().max()
    assert k_err <= 1e-5 and v_err <= 1e-5

    # survivors keep their K/V: run a new leaf under node 7 in both caches, same logits
    sub_mask = torch.tensor([[True, False, False], [True, True, False], [True, True, True]])
    fresh_out = model(toks[survivors + [0]], new_p + torch.tensor([0, 1, 2]), fresh,
                      new_p + torch.arange(3), new_p, sub_mask)  # fmt: skip
    leaf = toks[0:1]
    out = model(leaf, torch.tensor([new_p + 2]), cache, torch.tensor([new_p + 2]), new_p, sub_mask[2:])
    assert ((out[0] - fresh_out[2]).abs().max() / fresh_out[2].abs().max()) <= 1e-5
