"""The device loop on CUDA: its captured graphs give the host loop's tokens, token for token.

float32 on the GPU, so the two loops' forwards (other row counts, other mask widths) agree to
rounding and their argmax does too on these tiny random models; bf16 is what the benchmark
(`benchmarks/bench_device_loop.py`) compares."""

from __future__ import annotations

import pytest
import torch

from swiftspec.runtime.decoder import ModelRunner
from swiftspec.runtime.generate import GenerateConfig, cache_slots, generate
from swiftspec.runtime.synthetic import SyntheticVerifier
from swiftspec.runtime.weights import load_model
from swiftspec.spec import Mode, SamplingParams, TreePolicy

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

POLICIES = {
    "autoregressive": (Mode.autoregressive, TreePolicy.autoregressive(), False),
    "chain3": (Mode.chain, TreePolicy.chain(3), False),
    "bs8-w2-d3": (Mode.serial, TreePolicy(bs=8, w=2, d=3), False),
    "bs8-w4-d3-keep": (Mode.serial, TreePolicy(bs=8, w=4, d=3), True),
    "static7": (Mode.serial, TreePolicy(bs=7, w=1, d=0, kind="static", topology=(-1, 0, 0, 1, 1, 3, 2)), False),
}
VERIFY = ("greedy", "sampled", "synthetic")
RANKS = [0, 1, 0, 0, 2, -1, 0, 1, 0, 0, 0, 3, 1, -1] * 20


@pytest.fixture(scope="module")
def models(make_checkpoint):
    target = load_model(make_checkpoint("llama"), device="cuda")
    draft = load_model(make_checkpoint("llama"), device="cuda")
    g = torch.Generator(device="cuda").manual_seed(7)
    with torch.no_grad():
        for p in draft.parameters():  # a noisy copy of the target: accepts some, not all
            p.add_(0.02 * torch.randn(p.shape, generator=g, device="cuda"))
    return target, draft


@pytest.mark.parametrize("verify", VERIFY)
@pytest.mark.parametrize("name", POLICIES)
def test_captured_device_loop_gives_the_host_loops_tokens(models, name, verify):
    mode, policy, keep = POLICIES[name]
    if verify == "synthetic" and mode is Mode.autoregressive:
        pytest.skip("synthetic acceptance replays draft ranks")
    target, draft = models
    prompt, n = [3, 17, 42, 99, 5, 61, 7], 40
    spec = mode is not Mode.autoregressive
    out = {}
    for loop in ("host", "device"):
        t = ModelRunner(target, cache_slots(len(prompt), n, policy, draft=False))
        d = ModelRunner(draft, cache_slots(len(prompt), n, policy, draft=True)) if spec else None
        cfg = GenerateConfig(mode, policy, n, keep_subtree=keep, loop=loop,
                             sampling=SamplingParams(temperature=0.9, seed=4) if verify == "sampled" else SamplingParams(),
                             rank_logprobs=(-0.2, -1.9, -2.6, -3.4) if verify == "synthetic" else None)
        verifier = SyntheticVerifier(RANKS) if verify == "synthetic" else None
        out[loop] = generate(t, d, prompt, cfg, verifier=verifier)
        if loop == "device":
            (dl,) = t.loops.values()
            assert dl.use_graphs and dl.graphs is not None  # replayed, not eager
            assert out[loop].device_ms is not None and out[loop].device_ms > 0
    assert out["device"].tokens == out["host"].tokens
    assert [r.accepted for r in out["device"].records] == [r.accepted for r in out["host"].records]
