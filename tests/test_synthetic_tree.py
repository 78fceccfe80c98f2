"""Synthetic-acceptance runs grow the tree the simulator assumes, step for step.

With random weights the draft's distribution is nearly flat, so a tree grown by the draft's own
log-probabilities has another shape than the simulator's rank view (bs=8 fills with root siblings,
capping acceptance near 2: the H200 run of benchmarks/bench_async_gpu.py measured 1.97 where 2.66
/ 3.35 were predicted). In synthetic mode the runtime now takes cum_logprob from the acceptance
profile's log q[rank] (`DraftTree.rank_logprobs`). These tests run the real runtime (`generate`,
and the two-process async engine) with a random-weight draft and compare, per iteration, the
accepted length, the nodes sent and the tokens of every draft forward (pending verified tokens
included) with `rank_tree.request_trajectory`.
"""

from __future__ import annotations

import numpy as np
import pytest

from swiftspec.runtime.decoder import ModelRunner
from swiftspec.runtime.generate import GenerateConfig, generate
from swiftspec.runtime.synthetic import SyntheticVerifier, rank_logprobs
from swiftspec.runtime.weights import load_model
from swiftspec.sim.acceptance import AcceptanceModel, default_acceptance
from swiftspec.sim.rank_tree import request_trajectory
from swiftspec.spec import Mode, Split, TreePolicy

MAX_NEW = 24
PROMPT = [5, 17, 99, 3, 250, 42, 7]
SERIAL_POLICIES = [
    (Mode.serial, TreePolicy(bs=8, w=8, d=3)),
    (Mode.serial, TreePolicy(bs=16, w=4, d=4)),
    (Mode.serial, TreePolicy(bs=6, w=2, d=5, max_depth=3)),
    (Mode.chain, TreePolicy.chain(4)),
    (Mode.serial, TreePolicy(bs=7, w=1, d=0, kind="static", topology=(-1, 0, 0, 1, 1, 2, 3))),
]


@pytest.fixture(scope="module")
def acceptance():
    prof, _ = default_acceptance()  # synthetic, 16 ranks, q_k = 0.6 * 0.3^k
    return prof


@pytest.fixture(scope="module")
def pair(make_checkpoint):
    """Target and a random-weight draft whose logits are nearly flat (std 0.02 weights)."""
    target = load_model(make_checkpoint("llama", num_hidden_layers=2, seed=3))
    draft = load_model(make_checkpoint("llama", num_hidden_layers=1, seed=9, weight_std=0.02))
    return target, draft


def _run_serial(pair, mode, policy, path, logq):
    target, draft = pair
    cfg = GenerateConfig(mode=mode, policy=policy, max_new_tokens=MAX_NEW, keep_subtree=False,
                         rank_logprobs=None if logq is None else tuple(logq))
    t = ModelRunner(target, 512)
    d = ModelRunner(draft, 512)
    return generate(t, d, PROMPT, cfg, verifier=SyntheticVerifier(path))


def _expected(mode, policy, acc_model, path):
    logq = acc_model.child_logprobs(policy.w)
    return request_trajectory(mode, policy, logq, np.asarray(path), MAX_NEW)


@pytest.mark.parametrize("mode,policy", SERIAL_POLICIES, ids=lambda x: getattr(x, "key", str(x)))
def test_serial_synthetic_run_matches_simulator(pair, acceptance, mode, policy):
    acc = AcceptanceModel(acceptance)
    logq = rank_logprobs(acceptance)
    for path in acc.request_paths(2, MAX_NEW + 64, seed=11):
        want = _expected(mode, policy, acc, path)
        res = _run_serial(pair, mode, policy, path.tolist(), logq)
        assert [r.accepted for r in res.records] == [t.accepted for t in want]
        assert [r.verified for r in res.records] == [t.sent for t in want]
        # forwards and tokens per forward agree, step for step (pending tokens included)
        assert [list(r.forward_tokens) for r in res.records] == [[f for f, _ in t.pre] for t in want]
        assert res.tokens and len(res.tokens) == MAX_NEW


def test_flat_draft_without_rank_logprobs_grows_another_tree(pair, acceptance):
    """The bug this fixes: the draft's own (flat) log-probabilities give a bushier tree."""
    acc = AcceptanceModel(acceptance)
    policy = TreePolicy(bs=8, w=8, d=3)
    path = acc.request_paths(1, MAX_NEW + 64, seed=11)[0]
    want = [t.accepted for t in _expected(Mode.serial, policy, acc, path)]
    old = _run_serial(pair, Mode.serial, policy, path.tolist(), None)
    assert [r.accepted for r in old.records] != want
    assert max(r.accepted for r in old.records) <= 2  # only root children were verified


def test_async_synthetic_run_matches_simulator(make_checkpoint, acceptance):
    from swiftspec.runtime.engine import Job, Task
    from swiftspec.runtime.launch import launch

    acc = AcceptanceModel(acceptance)
    target = make_checkpoint("llama", num_hidden_layers=2, seed=3)
    draft = make_checkpoint("llama", num_hidden_layers=1, seed=9, weight_std=0.02)
    policies = [TreePolicy(bs=8, w=8, d=3), TreePolicy(bs=6, w=2, d=2)]
    prompts = [PROMPT, PROMPT[:4]]
    paths = [p.tolist() for p in acc.request_paths(len(prompts), MAX_NEW + 64, seed=5)]
    job = Job(target=str(target), draft=str(draft), split=Split.disaggregated(1, 1),
              tasks=[Task(Mode.async_, p) for p in policies], prompts=prompts, max_new_tokens=MAX_NEW,
              rank_paths=paths, rank_logprobs=rank_logprobs(acceptance), timeout_s=60)
    results = launch(job)
    for policy, res in zip(policies, results):
        for pi, path in enumerate(paths):
            rows = sorted((r for r in res["rows"] if r["prompt"] == pi), key=lambda r: r["iteration"])
            want = _expected(Mode.async_, policy, acc, path)
            assert [r["accepted"] for r in rows] == [t.accepted for t in want], (policy.key, pi)
            assert [r["sent"] for r in rows] == [t.sent for t in want]
            assert [r["tree_size"] for r in rows] == [t.tree_size for t in want]
            assert [r["forward_tokens"] for r in rows] == [[f for f, _ in (*t.pre, *t.overlap)] for t in want]
            assert [r["pre_forwards"] for r in rows] == [len(t.pre) for t in want]
