"""The device-resident loop (`device_loop.DeviceLoop`, `generate(..., loop="device")`) is lossless
and is the host loop (`DraftTree`) in fixed-shape tensors: same tokens, same trees, same records.

Properties checked (float32, CPU, the default tiny checkpoint and a noisy copy of it as the draft,
so acceptance is partial and every accept / reject / re-root path runs):
  * over random policies (chain, serial dynamic, serial keep_subtree, static topologies) the device
    loop's greedy output is the target's own greedy output, for >= 200 iterations each;
  * device == host, record by record, for greedy, sampled (also top-k / top-p) and synthetic
    (rank-path) verification, including the synthetic verifier's consumed ranks;
  * sampled device output == target-only sampling with the same seed;
  * EOS stops right after the stop token, max_new_tokens cuts exactly, also inside an iteration;
  * `LoopPlan.build`: a static round is the `DraftTree`'s level-by-level fill, node for node, and a
    dynamic plan holds whatever a host round can create;
  * runners (and the `DeviceLoop` cached on the target) are reusable across prompts.
"""

from __future__ import annotations

import collections
import math
import os
import random
import traceback

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from swiftspec.runtime.decoder import ModelRunner
from swiftspec.runtime.device_loop import LoopPlan
from swiftspec.runtime.generate import GenerateConfig, GenerateResult, cache_slots, generate
from swiftspec.runtime.synthetic import SyntheticVerifier, rank_logprobs
from swiftspec.runtime.tree import DraftTree
from swiftspec.runtime.verify import SamplingVerifier
from swiftspec.runtime.weights import load_model
from swiftspec.sim.acceptance import AcceptanceModel, default_acceptance
from swiftspec.spec import Mode, SamplingParams, TreePolicy

GREEDY = SamplingParams()
LONG = 450  # tokens of a lossless-over-random-policies case: >= 200 iterations at the noisy draft's acceptance
STATIC = (-1, 0, 0, 1, 1, 3, 2, 0, 4)  # fan-out 3 at the root, depth 4


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def models(make_checkpoint):
    """The default tiny llama target and a noisy copy of it (accepts some drafted tokens, not all)."""
    target = load_model(make_checkpoint("llama"))
    noisy = load_model(make_checkpoint("llama"))
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in noisy.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=g))
    return target, noisy


def make_runners(target, draft, prompt_len: int, n: int, policy: TreePolicy):
    """Runners sized as `generate_from_checkpoints` sizes them."""
    t = ModelRunner(target, cache_slots(prompt_len, n, policy, draft=False))
    d = ModelRunner(draft, cache_slots(prompt_len, n, policy, draft=True)) if draft is not None else None
    return t, d


def decode(target, draft, prompt, mode=Mode.autoregressive, policy=None, n=64, *, loop="host", keep=False,
           eos=(), sampling=GREEDY, verifier=None, rank_lp=None, runners=None) -> GenerateResult:  # fmt: skip
    """One generation; fresh runners unless `runners` = (target runner, draft runner) is given."""
    policy = policy or TreePolicy.autoregressive()
    policy.validate(mode)
    t, d = runners if runners is not None else make_runners(target, draft, len(prompt), n, policy)
    cfg = GenerateConfig(mode, policy, n, tuple(eos), keep, rank_logprobs=rank_lp, sampling=sampling, loop=loop)
    res = generate(t, d, prompt, cfg, verifier=verifier)
    assert res.loop == loop
    return res


def record_rows(res: GenerateResult) -> list[tuple]:
    """What must agree between the loops, per iteration (times excluded)."""
    return [(r.accepted, r.verified, r.tree_nodes, r.draft_forwards, r.draft_tokens, r.forward_tokens)
            for r in res.records]  # fmt: skip


def first_difference(a: list, b: list) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def assert_same_records(host: GenerateResult, dev: GenerateResult) -> None:
    h, d = record_rows(host), record_rows(dev)
    i = first_difference(h, d)
    assert i is None, (f"device loop record {i} differs from the host loop's "
                       f"(accepted, verified, tree_nodes, draft_forwards, draft_tokens, forward_tokens): "
                       f"host {h[i] if i < len(h) else None} device {d[i] if i < len(d) else None}")  # fmt: skip


def random_prompt(rng: random.Random, lo: int = 1, hi: int = 10) -> list[int]:
    return [rng.randrange(256) for _ in range(rng.randint(lo, hi))]


def random_topology(rng: random.Random, size: int) -> tuple[int, ...]:
    """A valid static topology: root first, every parent before its child."""
    return (-1, *(rng.randrange(i) for i in range(1, size)))


# ---- 1. lossless over random policies ---------------------------------------------------------


def _random_cases(seed: int, count: int = 6) -> list[tuple[str, Mode, TreePolicy, bool]]:
    """(id, mode, policy, keep_subtree); the first four cover chain, serial, serial keep, static."""
    rng = random.Random(seed)
    kinds = ["chain", "serial", "keep", "static"]
    cases = []
    for i in range(count):
        kind = kinds[i] if i < len(kinds) else rng.choice(kinds)
        if kind == "chain":
            k = rng.randint(1, 5)
            cases.append((f"chain{k}", Mode.chain, TreePolicy.chain(k), False))
            continue
        if kind == "static":
            topo = random_topology(rng, rng.randint(2, 12))
            policy = TreePolicy(bs=len(topo), w=1, d=0, kind="static", topology=topo)
            cases.append(("static-" + ".".join(map(str, topo[1:])), Mode.serial, policy, False))
            continue
        max_depth = rng.choice([0, rng.randint(0, 3)])
        policy = TreePolicy(bs=rng.randint(2, 16), w=rng.randint(1, 6), d=rng.randint(1, 5), max_depth=max_depth)
        keep = kind == "keep"
        cases.append((policy.key + ("-keep" if keep else ""), Mode.serial, policy, keep))
    return [(f"{i}-{name}", mode, policy, keep) for i, (name, mode, policy, keep) in enumerate(cases)]


RANDOM_CASES = _random_cases(seed=2024)


@pytest.mark.parametrize("case", RANDOM_CASES, ids=[c[0] for c in RANDOM_CASES])
def test_device_loop_is_lossless_over_random_policies(models, case) -> None:
    """Greedy device-loop output == the target's own greedy output (autoregressive, host loop),
    token for token, over >= 200 iterations of partial acceptance."""
    name, mode, policy, keep = case
    target, noisy = models
    prompt = random_prompt(random.Random(name))
    ref = decode(target, None, prompt, n=LONG).tokens
    res = decode(target, noisy, prompt, mode, policy, LONG, loop="device", keep=keep)
    assert len(ref) == LONG
    i = first_difference(res.tokens, ref)
    assert i is None, f"{name}: device-loop output differs from target-only greedy at token {i}"
    assert len(res.records) >= 200, f"only {len(res.records)} iterations: raise LONG"
    accepted = [r.accepted for r in res.records]
    assert sum(accepted) >= LONG and res.stop == "max_new_tokens"
    assert max(accepted) > 1 and min(accepted) == 1, "acceptance must be partial (accept and reject paths)"
    assert all(1 <= r.verified <= policy.bs and r.accepted <= r.verified <= r.tree_nodes for r in res.records)


# ---- 2. device loop == host loop, record by record ------------------------------------------

POLICY_CASES = {
    "chain4": (Mode.chain, TreePolicy.chain(4), False),
    "bs10-w3-d4": (Mode.serial, TreePolicy(bs=10, w=3, d=4), False),
    "bs12-w4-d3-D2-keep": (Mode.serial, TreePolicy(bs=12, w=4, d=3, max_depth=2), True),
    "bs6-w2-d5-keep": (Mode.serial, TreePolicy(bs=6, w=2, d=5), True),
    "bs2-w1-d5-keep": (Mode.serial, TreePolicy(bs=2, w=1, d=5), True),  # kept chains outgrow keep_limit: pruned
    "static9": (Mode.serial, TreePolicy(bs=len(STATIC), w=1, d=0, kind="static", topology=STATIC), False),
}
VERIFY_CASES = {
    "greedy": GREEDY,
    "sampled-T0.8": SamplingParams(temperature=0.8, seed=3),
    "sampled-T1.3-k6-p0.85": SamplingParams(temperature=1.3, seed=5, top_k=6, top_p=0.85),
    "synthetic": None,  # a rank path of the bundled profile, with its rank_logprobs
    "synthetic-short-path": None,  # the path ends mid-generation: the rest reads rank -1
    "synthetic-zero-q": None,  # q = 0 beyond rank 1: -inf cum_logprobs, tied, broken by id
}
N_EXACT = 80


@pytest.fixture(scope="module")
def profile():
    return default_acceptance()[0]


def _verifier_and_rank_lp(kind: str, profile, seed: int):
    if not kind.startswith("synthetic"):
        sampling = VERIFY_CASES[kind]
        return (lambda: None) if sampling.greedy else (lambda: SamplingVerifier(sampling)), None
    length = 40 if kind.endswith("short-path") else N_EXACT + 64
    path = AcceptanceModel(profile).request_paths(1, length, seed=seed)[0].tolist()
    rank_lp = tuple(rank_logprobs(profile))
    if kind.endswith("zero-q"):
        rank_lp = (math.log(0.6), math.log(0.25)) + (-math.inf,) * (len(rank_lp) - 2)
    return (lambda: SyntheticVerifier(path)), rank_lp


@pytest.mark.parametrize("kind", list(VERIFY_CASES))
@pytest.mark.parametrize("name", list(POLICY_CASES))
def test_device_loop_equals_host_loop(models, profile, name: str, kind: str) -> None:
    """Same tokens, same stop and, per iteration, the same accepted length, nodes verified, tree
    size, draft forwards and tokens per forward; synthetic: the same ranks consumed."""
    mode, policy, keep = POLICY_CASES[name]
    target, noisy = models
    rng = random.Random(f"{name}/{kind}")
    prompt = random_prompt(rng)
    new_verifier, rank_lp = _verifier_and_rank_lp(kind, profile, seed=rng.randrange(1000))
    sampling = GREEDY if kind.startswith("synthetic") else VERIFY_CASES[kind]
    runs = {}
    for loop in ("host", "device"):
        verifier = new_verifier()
        res = decode(target, noisy, prompt, mode, policy, N_EXACT, loop=loop, keep=keep, sampling=sampling,
                     verifier=verifier, rank_lp=rank_lp)  # fmt: skip
        runs[loop] = res, verifier
    (host, hv), (dev, dv) = runs["host"], runs["device"]
    i = first_difference(dev.tokens, host.tokens)
    assert i is None, f"device-loop tokens differ from the host loop's at token {i}"
    assert len(dev.tokens) == N_EXACT and dev.stop == host.stop == "max_new_tokens"
    assert_same_records(host, dev)
    accepted = [r.accepted for r in dev.records]
    assert max(accepted) > 1, "no drafted token was accepted: the accept path did not run"
    if isinstance(hv, SyntheticVerifier):
        j = first_difference(dv.consumed, hv.consumed)
        assert j is None, f"synthetic ranks consumed differ at verify {j}: host {hv.consumed[j]} device {dv.consumed[j]}"
        assert dv.pos == hv.pos and dv.last_bonus_rank == hv.last_bonus_rank
    elif isinstance(hv, SamplingVerifier):
        assert dv.produced == hv.produced == sum(accepted)


# ---- 2b. capturable: nothing in an iteration reads the device from the host ------------------

# aten ops that stop a CUDA graph capture: a device value read on the host (.item(), nonzero,
# boolean-mask indexing) or host data copied in (torch.tensor of a Python list)
SYNCING = {"aten._local_scalar_dense.default", "aten.nonzero.default", "aten.masked_select.default",
           "aten.lift_fresh.default", "aten.is_nonzero.default", "aten.equal.default"}


class SyncingOps(TorchDispatchMode):
    """Counts the `SYNCING` ops (and indexing by a boolean tensor) run under it, by op and by the
    device_loop.py line that ran it."""

    def __init__(self):
        super().__init__()
        self.found: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        index = args[1] if name.startswith("aten.index") and len(args) > 1 else None
        by_mask = isinstance(index, (list, tuple)) and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool
                                                           for i in index)
        if name in SYNCING or by_mask:
            lines = [f.lineno for f in traceback.extract_stack() if f.filename.endswith(os.path.join("runtime", "device_loop.py"))]
            self.found[(name, lines[-1] if lines else None)] += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("kind", ["greedy", "sampled-T0.8", "synthetic"])
@pytest.mark.parametrize("name", ["chain4", "bs10-w3-d4", "bs6-w2-d5-keep", "static9"])
def test_device_loop_iteration_never_syncs(models, profile, name: str, kind: str) -> None:
    """The torch form of an iteration (what CUDA captures for a kept subtree, and the fused
    kernels' reference) runs no op that reads a device value on the host or copies host data in:
    any of them would break the CUDA graph of the iteration."""
    mode, policy, keep = POLICY_CASES[name]
    target, noisy = models
    new_verifier, rank_lp = _verifier_and_rank_lp(kind, profile, seed=1)
    sampling = GREEDY if kind == "synthetic" else VERIFY_CASES[kind]
    t, d = make_runners(target, noisy, 7, 48, policy)
    decode(target, noisy, [3, 17, 42, 99, 5, 61, 7], mode, policy, 48, loop="device", keep=keep, sampling=sampling,
           verifier=new_verifier(), rank_lp=rank_lp, runners=(t, d))  # fmt: skip
    (loop,) = t.loops.values()
    ops = SyncingOps()
    with torch.no_grad(), ops:
        for _ in range(4):
            loop.draft_round()
            loop.verify_and_update()
    assert not ops.found, f"syncing ops in an iteration (op, device_loop.py line): {dict(ops.found)}"


# ---- 3. lossless sampling -------------------------------------------------------------------

SAMPLED = {
    "T0.8-seed11": SamplingParams(temperature=0.8, seed=11),
    "T1.5-seed12-k8-p0.9": SamplingParams(temperature=1.5, seed=12, top_k=8, top_p=0.9),
}


@pytest.mark.parametrize("sampling_name", list(SAMPLED))
@pytest.mark.parametrize("name", ["chain4", "bs10-w3-d4", "bs6-w2-d5-keep", "static9"])
def test_sampled_device_loop_equals_target_only_sampling(models, name: str, sampling_name: str) -> None:
    """Sampled speculation on the device loop == target-only sampling with the same seed."""
    mode, policy, keep = POLICY_CASES[name]
    sampling = SAMPLED[sampling_name]
    target, noisy = models
    prompt = random_prompt(random.Random(f"sampled/{name}/{sampling_name}"))
    n = 120
    ref = decode(target, None, prompt, n=n, sampling=sampling).tokens
    res = decode(target, noisy, prompt, mode, policy, n, loop="device", keep=keep, sampling=sampling)
    i = first_difference(res.tokens, ref)
    assert i is None, f"sampled device-loop output differs from target-only sampling at token {i}"
    assert max(r.accepted for r in res.records) > 1, "no drafted token was accepted"
    assert ref != decode(target, None, prompt, n=n).tokens, "the draws equal the greedy tokens: sampling did not run"


def test_autoregressive_device_loop_equals_host(models) -> None:
    """No draft (LoopConfig.plan None): greedy and sampled, device == host."""
    target, _ = models
    prompt = random_prompt(random.Random("ar"))
    for sampling in (GREEDY, SAMPLED["T1.5-seed12-k8-p0.9"]):
        host = decode(target, None, prompt, n=80, sampling=sampling)
        dev = decode(target, None, prompt, n=80, loop="device", sampling=sampling)
        assert dev.tokens == host.tokens and len(dev.tokens) == 80
        assert_same_records(host, dev)


# ---- 4. stop conditions ---------------------------------------------------------------------

STOP_POLICIES = {
    "autoregressive": (Mode.autoregressive, TreePolicy.autoregressive(), False),
    **{k: POLICY_CASES[k] for k in ("chain4", "bs10-w3-d4", "bs6-w2-d5-keep", "static9")},
}
EOS_PROMPT = [3, 14, 15, 92, 65]


@pytest.fixture(scope="module")
def eos_reference(models):
    target, _ = models
    return decode(target, None, EOS_PROMPT, n=80).tokens


@pytest.mark.parametrize("where", ["first-token", "mid-way"])
@pytest.mark.parametrize("draft_kind", ["noisy", "self"])
@pytest.mark.parametrize("name", list(STOP_POLICIES))
def test_eos_stops_right_after_the_stop_token(models, eos_reference, name: str, draft_kind: str, where: str) -> None:
    """eos_ids holding a token the target produces: the output ends right after its first
    occurrence (kept), as on the host loop, and stop == "eos". A self-draft accepts whole rounds,
    so the stop falls inside an iteration's accepted tokens."""
    mode, policy, keep = STOP_POLICIES[name]
    if mode is Mode.autoregressive and draft_kind == "self":
        pytest.skip("no draft")
    target, noisy = models
    draft = None if mode is Mode.autoregressive else (noisy if draft_kind == "noisy" else target)
    ref = eos_reference
    k = 0 if where == "first-token" else next(i for i in range(23, len(ref)) if ref[i] not in ref[:i])
    never = next(t for t in range(256) if t not in ref)
    eos = (never, ref[k])
    host = decode(target, draft, EOS_PROMPT, mode, policy, 80, keep=keep, eos=eos)
    dev = decode(target, draft, EOS_PROMPT, mode, policy, 80, loop="device", keep=keep, eos=eos)
    assert host.tokens == ref[: k + 1] and host.stop == "eos"
    assert dev.tokens == ref[: k + 1], f"device loop: {len(dev.tokens)} tokens, want {k + 1} ending at the EOS id"
    assert dev.stop == "eos"
    assert_same_records(host, dev)


@pytest.mark.parametrize("n", [1, 2, 7, 13, 31])
@pytest.mark.parametrize("name", ["chain4", "bs10-w3-d4", "bs6-w2-d5-keep", "static9"])
def test_max_new_tokens_cuts_exactly(models, eos_reference, name: str, n: int) -> None:
    """len(tokens) == max_new_tokens even where the last iteration accepts more (self-draft:
    whole rounds are accepted, so most budgets end inside an iteration)."""
    mode, policy, keep = POLICY_CASES[name]
    target, _ = models
    host = decode(target, target, EOS_PROMPT, mode, policy, n, keep=keep)
    dev = decode(target, target, EOS_PROMPT, mode, policy, n, loop="device", keep=keep)
    assert len(dev.tokens) == n, f"device loop produced {len(dev.tokens)} tokens for max_new_tokens={n}"
    assert dev.tokens == host.tokens == eos_reference[:n] and dev.stop == "max_new_tokens"
    assert_same_records(host, dev)
    if name == "chain4":  # a self-draft accepts all 4 drafted tokens + the bonus every iteration
        assert [r.accepted for r in dev.records] == [5] * math.ceil(n / 5)


# ---- 5. LoopPlan.build ----------------------------------------------------------------------


def _host_levels(policy: TreePolicy, vocab: int, seed: int):
    """Fill a DraftTree as `generate` does (real `grow`, random logits): per expansion the batch
    and the ids of every batch node's children; and the filled tree."""
    g = torch.Generator().manual_seed(seed)
    tree = DraftTree.fresh(0, policy)
    levels = []
    while batch := tree.next_batch():
        before = len(tree)
        tree.expand(lambda tokens, depths, slots, mask: torch.randn(len(tokens), vocab, generator=g))
        levels.append((tuple(batch), tuple(tuple(c for c in tree.children[b] if c >= before) for b in batch),
                       len(tree)))  # fmt: skip
    return levels, tree


def _bfs_ids(topo: tuple[int, ...]) -> dict[int, int]:
    """Independent reference: node ids of a level-by-level fill = breadth-first order of the
    topology, children in topology (rank) order."""
    kids = {i: [j for j, p in enumerate(topo) if p == i] for i in range(len(topo))}
    order, frontier = [0], [0]
    while frontier:
        frontier = [c for n in frontier for c in kids[n]]
        order += frontier
    return {t: i for i, t in enumerate(order)}


STATIC_TOPOS = [STATIC, (-1, 0), (-1, 0, 1, 2, 3), (-1, 0, 0, 0, 0, 0)] + [
    random_topology(random.Random(s), random.Random(s).randint(2, 16)) for s in range(12)
]


@pytest.mark.parametrize("topo", STATIC_TOPOS, ids=lambda t: "static-" + ".".join(map(str, t[1:])))
def test_static_plan_is_the_host_trees_level_by_level_fill(topo) -> None:
    policy = TreePolicy(bs=len(topo), w=1, d=0, kind="static", topology=topo)
    policy.validate(Mode.serial)
    plan = LoopPlan.build(policy, 256)
    levels, tree = _host_levels(policy, 256, seed=len(topo))
    N = len(topo)
    assert plan.nodes == N == len(tree) and not plan.keep
    assert plan.slots == max(tree.num_slots, 1)
    assert len(plan.expansions) == len(levels)
    for e, (x, (batch, children, count)) in enumerate(zip(plan.expansions, levels)):
        assert x.pending == (e == 0)
        assert x.batch == batch, f"level {e}: plan batch {x.batch}, DraftTree batch {batch}"
        assert x.rows == len(batch) and x.k == max(len(c) for c in children)
        got = tuple(tuple(c for c in row if c != N) for row in x.children)
        assert got == children, f"level {e}: plan children {got}, DraftTree children {children}"
        assert all(len(row) == x.k for row in x.children)
        assert x.count_after == count
    # and both are the topology's breadth-first order (an independent reference)
    bfs = _bfs_ids(topo)
    assert [bfs[tree.topo[i]] for i in range(N)] == list(range(N))


DYNAMIC_PLANS = [(TreePolicy(bs=r.randint(2, 16), w=r.randint(1, 6), d=r.randint(1, 5), max_depth=r.choice([0, 0, 1, 2, 3])),
                  r.random() < 0.5, r.choice([256, 256, 3]))
                 for r in (random.Random(100 + s) for s in range(16))]  # fmt: skip


@pytest.mark.parametrize("policy,keep,vocab", DYNAMIC_PLANS,
                         ids=[f"{p.key}{'-keep' if k else ''}-V{v}" for p, k, v in DYNAMIC_PLANS])
def test_dynamic_plan_holds_a_round(policy: TreePolicy, keep: bool, vocab: int) -> None:
    """Node capacity >= what a round can create (a kept tree of keep_limit nodes, then d forwards
    of w nodes with min(w, vocab) children each), and host rounds fit it (nodes, draft slots,
    forwards, rows per forward)."""
    plan = LoopPlan.build(policy, vocab, keep=keep)
    k = min(policy.w, vocab)
    bound = (policy.keep_limit + policy.d * policy.w * k) if keep else (1 + k + (policy.d - 1) * policy.w * k)
    assert plan.nodes >= max(bound, policy.bs) and plan.keep == keep
    assert len(plan.expansions) == policy.d and all(x.k == k for x in plan.expansions)
    assert all(x.batch is None for x in plan.expansions[0 if keep else 1 :])  # chosen on the device
    g = torch.Generator().manual_seed(policy.bs * 100 + policy.w)
    tree = DraftTree.fresh(0, policy)
    for _round in range(6):
        fwd = 0
        for e in range(policy.d):
            batch = tree.next_batch()
            if not batch:
                break
            assert len(batch) <= plan.expansions[e].rows
            tree.expand(lambda tokens, depths, slots, mask: torch.randn(len(tokens), vocab, generator=g))
            fwd += 1
        assert fwd <= len(plan.expansions)
        assert len(tree) <= plan.nodes and tree.num_slots <= plan.slots, (len(tree), tree.num_slots, plan)
        if not keep:
            break
        # keep: re-root at the best child of the root (or deeper), pruned to keep_limit as the host does
        node = max(tree.children[0], key=lambda c: (tree.cum_logprob[c], -c))
        tree, _ = tree.reroot(node, keep=policy.keep_limit)
        assert len(tree) <= policy.keep_limit


# ---- 6. runners reused across prompts -------------------------------------------------------

REUSE = {
    "autoregressive": (Mode.autoregressive, TreePolicy.autoregressive(), False, GREEDY),
    "bs10-w3-d4": (*POLICY_CASES["bs10-w3-d4"], GREEDY),
    "bs6-w2-d5-keep": (*POLICY_CASES["bs6-w2-d5-keep"], GREEDY),
    "static9": (*POLICY_CASES["static9"], GREEDY),
    "chain4-sampled": (*POLICY_CASES["chain4"], SamplingParams(temperature=0.9, seed=4)),
}


def _reset(runner: ModelRunner | None) -> None:
    """As `engine._reset`: empty a runner for the next prompt, keeping its cache."""
    if runner is not None:
        runner.prefix_len, runner.tree_len, runner.pending = 0, 0, []


@pytest.mark.parametrize("name", list(REUSE))
def test_runners_reused_across_prompts(models, name: str) -> None:
    """Prompts decoded one after another on the same runners (reset in between, the DeviceLoop
    cached on the target runner) give the tokens of fresh runners; the loop is built once."""
    mode, policy, keep, sampling = REUSE[name]
    target, noisy = models
    draft = None if mode is Mode.autoregressive else noisy
    rng = random.Random(f"reuse/{name}")
    prompts = [random_prompt(rng, 8, 12), [rng.randrange(256)], random_prompt(rng, 2, 6)]
    n = 40
    shared = make_runners(target, draft, max(map(len, prompts)), n, policy)
    loops = []
    for i, prompt in enumerate(prompts + prompts[:1]):
        for r in shared:
            _reset(r)
        got = decode(target, draft, prompt, mode, policy, n, loop="device", keep=keep, sampling=sampling,
                     runners=shared)  # fmt: skip
        want = decode(target, draft, prompt, mode, policy, n, loop="device", keep=keep, sampling=sampling)
        j = first_difference(got.tokens, want.tokens)
        assert j is None, f"prompt {i} on reused runners differs from fresh runners at token {j}"
        assert_same_records(want, got)
        loops.append(dict(shared[0].loops))
    assert len(loops[-1]) == 1, "one DeviceLoop per (draft, config) on the target runner"
    assert all(x == loops[0] and list(x.values())[0] is list(loops[0].values())[0] for x in loops)


def test_generate_result_fields_on_device(models) -> None:
    """The device path's result carries the host path's bookkeeping."""
    target, noisy = models
    mode, policy, keep = POLICY_CASES["bs10-w3-d4"]
    res = decode(target, noisy, EOS_PROMPT, mode, policy, 40, loop="device", keep=keep)
    assert res.iterations == len(res.records) and res.policy == policy.key and res.mode == "serial"
    assert res.mean_accepted == pytest.approx(sum(r.accepted for r in res.records) / len(res.records))
    assert res.device_ms is None  # CPU: no graph replays


# ---- narrow vocabularies and the iteration after the stop ------------------------------------

NARROW = {
    "bs10-w5-d3-V3": (TreePolicy(bs=10, w=5, d=3), False, 3),  # w > vocab: min(w, vocab) children
    "bs10-w5-d3-keep-V3": (TreePolicy(bs=10, w=5, d=3), True, 3),
    "static-fanout2-V3": (TreePolicy(bs=5, w=1, d=0, kind="static", topology=(-1, 0, 0, 1, 1)), False, 3),
    "static-fanout3-V2": (TreePolicy(bs=7, w=1, d=0, kind="static", topology=(-1, 0, 0, 0, 1, 1, 1)), False, 2),
}


@pytest.mark.parametrize("name", list(NARROW))
def test_narrow_vocabulary(models, name: str) -> None:
    """Runners whose logits are cut to a few ids (`vocab_limit`): the tree grows fewer children
    than the policy asks; device == host record by record, and both == target-only greedy."""
    policy, keep, vocab = NARROW[name]
    target, noisy = models
    prompt, n = [3, 14, 15, 92, 65], 40
    ref = generate(ModelRunner(target, 128, vocab_limit=vocab), None, prompt,
                   GenerateConfig(Mode.autoregressive, TreePolicy.autoregressive(), n)).tokens  # fmt: skip
    runs = {}
    for loop in ("host", "device"):
        t, d = ModelRunner(target, 128, vocab_limit=vocab), ModelRunner(noisy, 128, vocab_limit=vocab)
        runs[loop] = decode(target, noisy, prompt, Mode.serial, policy, n, loop=loop, keep=keep, runners=(t, d))
    assert runs["host"].tokens == ref
    i = first_difference(runs["device"].tokens, ref)
    assert i is None, (f"device loop with a {vocab}-id vocabulary differs from target-only greedy at token {i} "
                       f"(a static tree narrower than its topology: the device verifies all bs rows, "
                       f"nodes never created included)")  # fmt: skip
    assert_same_records(runs["host"], runs["device"])


AFTER_STOP = {
    "chain4-self": (TreePolicy.chain(4), False, "self", ()),
    "bs10-w3-d4-noisy": (TreePolicy(bs=10, w=3, d=4), False, "noisy", ()),
    "bs6-w2-d5-keep-self": (TreePolicy(bs=6, w=2, d=5), True, "self", ()),
    "static9-self-eos": (POLICY_CASES["static9"][1], False, "self", "eos"),
}


@pytest.mark.parametrize("name", list(AFTER_STOP))
def test_iteration_after_the_stop_changes_nothing(models, eos_reference, name: str) -> None:
    """On CUDA `DeviceLoop._replay_loop` reads `done` one iteration late, so one more iteration
    runs after the stop; the module docstring promises it changes nothing the caller sees: the
    output, the stats, and the runner state `decode` writes back (prefix lengths, the draft's
    pending token). Emulated on the CPU by running iterations past `done` by hand."""
    from swiftspec.runtime.device_loop import DeviceLoop, LoopConfig

    policy, keep, draft_kind, stop = AFTER_STOP[name]
    target, noisy = models
    draft = target if draft_kind == "self" else noisy
    prompt, n = EOS_PROMPT, 23
    eos = (eos_reference[17],) if stop == "eos" else ()
    t, d = make_runners(target, draft, len(prompt), n, policy)
    t.prefill(prompt[:-1])
    d.prefill(prompt[:-1])
    loop = DeviceLoop(t, d, LoopConfig(LoopPlan.build(policy, 256, keep=keep), "greedy", n, eos_ids=eos))
    loop.start(prompt[-1], None)
    while not bool(loop.done):
        loop._iteration()

    def seen():
        nout, iters = int(loop.nout), int(loop.iters)
        return dict(tokens=loop.out[:nout].tolist(), stats=loop.stats[:iters].tolist(), target_prefix=int(loop.t.prefix),
                    draft=(int(loop.d.prefix), int(loop.d.pend_tok) if int(loop.d.pend_n) else None))  # fmt: skip

    before = seen()
    want = eos_reference[: eos_reference.index(eos[0]) + 1] if eos else eos_reference[:n]
    assert before["tokens"] == want
    loop._iteration()  # the one iteration `_replay_loop` launches after the stop
    after = seen()
    for key in ("tokens", "stats", "target_prefix"):
        assert after[key] == before[key], f"an iteration after the stop changed the {key}"
    assert after["draft"] == before["draft"], (
        f"an iteration after the stop changed the draft state decode() writes back to the runner "
        f"(prefix_len, pending token): {before['draft']} -> {after['draft']} (on CUDA, where one such "
        f"iteration is always launched, the draft runner ends with a pending token that is not in the output)")
