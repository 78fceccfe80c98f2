"""The fused tree kernels (kernels/tree_state.py) against the torch reference (device_loop.py).

Two `DeviceLoop`s over the same runners' models, one with `fused=True`, one with `fused=False`
(with a kept subtree, half the dynamic cases, only the expansions are fused),
run the same iterations; after every draft round and every verify-and-update the whole tree state
(node table, cum_logprobs, ancestor matrix, counters), both prefixes, the pending token, the
output and the stats must be equal. Random trees come from a noisy copy of the target as the
draft, random policies from a seeded generator (dynamic with and without max_depth, chain,
static topologies), and all three verifications.
"""

from __future__ import annotations

import os
import random

import pytest
import torch

from swiftspec.runtime.decoder import ModelRunner
from swiftspec.runtime.device_loop import DeviceLoop, LoopConfig, LoopPlan
from swiftspec.runtime.weights import load_model
from swiftspec.spec import SamplingParams, TreePolicy

if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("Triton kernels need a GPU or TRITON_INTERPRET=1", allow_module_level=True)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def random_policy(rng: random.Random) -> TreePolicy:
    kind = rng.choice(["dynamic", "dynamic", "chain", "static"])
    if kind == "chain":
        return TreePolicy.chain(rng.randint(1, 5))
    if kind == "static":
        n = rng.randint(2, 12)
        return TreePolicy(bs=n, w=1, d=0, kind="static", topology=(-1, *(rng.randrange(i) for i in range(1, n))))
    return TreePolicy(bs=rng.randint(2, 12), w=rng.randint(1, 5), d=rng.randint(1, 4),
                      max_depth=rng.choice([0, 0, 2, 3]))


@pytest.fixture(scope="module")
def models(make_checkpoint):
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    target = load_model(make_checkpoint("llama"), device=DEVICE)
    draft = load_model(make_checkpoint("llama"), device=DEVICE)
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_((0.03 * torch.randn(p.shape, generator=g)).to(p.device))
    yield target, draft
    torch.set_num_threads(n)


def _state(loop: DeviceLoop) -> dict[str, torch.Tensor]:
    """Everything but the trash entries (node N, slot S, the last output cell, the last stats row),
    where padded rows write whatever they hold."""
    n, s = loop.N, loop.S
    out = {"nodes": loop.nodes[:, :n], "cum": loop.cum[:n], "anc": loop.anc[:n, :s], "count": loop.count,
           "nslots": loop.nslots, "t_prefix": loop.t.prefix, "out": loop.out[:-1], "nout": loop.nout,
           "done": loop.done, "iters": loop.iters, "stats": loop.stats[:-1], "pos": loop.pos}
    if loop.d is not None:
        out.update(d_prefix=loop.d.prefix, pend_n=loop.d.pend_n, pend_tok=loop.d.pend_tok)
    return {k: v.detach().clone() for k, v in out.items()}


def _assert_same(a: DeviceLoop, b: DeviceLoop, where: str) -> None:
    sa, sb = _state(a), _state(b)
    for key in sa:
        assert torch.equal(sa[key], sb[key]), f"{where}: {key} differs\nfused {sa[key]}\ntorch {sb[key]}"
    # the KV each side computed (the caches hold what the forwards wrote and the moves kept)
    n = int(a.t.prefix)
    assert torch.equal(a.t.cache.kv[:, :, :, :n], b.t.cache.kv[:, :, :, :n]), f"{where}: target KV differs"
    if a.d is not None:
        n = int(a.d.prefix)
        assert torch.equal(a.d.cache.kv[:, :, :, :n], b.d.cache.kv[:, :, :, :n]), f"{where}: draft KV differs"


@pytest.mark.parametrize("verify", ["greedy", "sampled", "synthetic"])
@pytest.mark.parametrize("seed", range(4))
def test_fused_steps_equal_the_torch_steps(models, seed: int, verify: str) -> None:
    target, draft = models
    rng = random.Random(seed * 7 + len(verify))
    policy = random_policy(rng)
    keep = policy.kind == "dynamic" and seed % 2 == 1  # a kept subtree: fused expansions, torch re-root
    prompt = [rng.randrange(256) for _ in range(rng.randint(1, 9))]
    ranks = [rng.choice([0, 0, 0, 1, 2, -1]) for _ in range(200)]
    max_new = 24
    loops = []
    for fused in (True, False):
        t = ModelRunner(target, len(prompt) + max_new + 4 * policy.bs + 8)
        d = ModelRunner(draft, len(prompt) + max_new + 4 * policy.bs + LoopPlan.build(policy, 256, keep=True).slots + 8)
        plan = LoopPlan.build(policy, draft.spec.vocab, keep=keep)
        cfg = LoopConfig(plan=plan, verify=verify, max_new_tokens=max_new,
                         eos_ids=(rng.randrange(256),), sampling=SamplingParams(temperature=0.7, seed=seed),
                         rank_logprobs=(-0.1, -1.7, -2.4, -3.1, -4.0, -5.2) if verify == "synthetic" else None,
                         bs=policy.bs)  # fmt: skip
        loop = DeviceLoop(t, d, cfg, graphs=False, fused=fused)
        assert loop.fused_expand is fused and loop.fused is (fused and not keep)
        t.prefill(prompt[:-1])
        d.prefill(prompt[:-1])
        stream = None
        if verify == "sampled":
            stream = torch.rand(loop.stream_len, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
            stream = stream.tolist()
        elif verify == "synthetic":
            stream = ranks
        loop.start(prompt[-1], stream)
        loops.append(loop)
    fused, ref = loops
    _assert_same(fused, ref, f"{policy.key} start")
    for it in range(12):
        for loop in loops:
            loop.draft_round()
        _assert_same(fused, ref, f"{policy.key} iteration {it} after the draft round")
        for loop in loops:
            loop.verify_and_update()
        _assert_same(fused, ref, f"{policy.key} iteration {it} after verify and update")
        if bool(ref.done):
            break


@pytest.mark.parametrize("verify", ["greedy", "sampled"])
def test_fused_autoregressive_equals_the_torch_steps(models, verify: str) -> None:
    target, _ = models
    loops = []
    for fused in (True, False):
        t = ModelRunner(target, 64)
        loop = DeviceLoop(t, None, LoopConfig(plan=None, verify=verify, max_new_tokens=10,
                                              sampling=SamplingParams(temperature=0.9, seed=2)),
                          graphs=False, fused=fused)  # fmt: skip
        t.prefill([5, 6, 7])
        loop.start(8, [0.1 * i for i in range(loop.stream_len)] if verify == "sampled" else None)
        loops.append(loop)
    for it in range(11):
        for loop in loops:
            loop.verify_and_update()
        _assert_same(*loops, f"autoregressive iteration {it}")
    assert int(loops[0].nout) == 10 and bool(loops[0].done)
