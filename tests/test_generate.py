"""Single-process decoding: lossless speculation, full acceptance of a self-draft, the CLI.

Lossless means: the speculative output equals the target's own greedy output token for token
(float32, CPU). References: our autoregressive mode, and transformers' `generate(do_sample=False)`
on the same checkpoint (independent of our runtime).
"""

from __future__ import annotations

import json
import random
import zlib

import pytest
import torch

from swiftspec.runtime.decoder import ModelRunner
from swiftspec.runtime.generate import GenerateConfig, GenerateResult, cache_slots, generate
from swiftspec.runtime.weights import load_model
from swiftspec.spec import Mode, SamplingParams, TreePolicy

ARCHS = ("llama", "qwen2")
NEW = 24  # generated tokens per case
SMALL_DRAFT = dict(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, num_key_value_heads=1,
                   intermediate_size=64, seed=1)  # fmt: skip
STATIC = (-1, 0, 0, 1, 1, 3, 2)  # rank-0 chain 0-1-3-5 is the deepest path (depth 3)
POLICIES = {
    "chain3": (Mode.chain, TreePolicy.chain(3), True),
    "bs8-w2-d3": (Mode.serial, TreePolicy(bs=8, w=2, d=3), True),
    "bs4-w3-d4-D3": (Mode.serial, TreePolicy(bs=4, w=3, d=4, max_depth=3), True),
    "bs10-w4-d4-fresh": (Mode.serial, TreePolicy(bs=10, w=4, d=4), False),
    "static7": (Mode.serial, TreePolicy(bs=7, w=1, d=0, kind="static", topology=STATIC), True),
}


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def decode(target, draft, prompt, mode=Mode.autoregressive, policy=None, n=NEW, keep=True, eos=(),
           temperature=0.0, sample_seed=0, sample_top_k=0, sample_top_p=1.0) -> GenerateResult:  # fmt: skip
    """Fresh runners (empty caches) sized as `generate_from_checkpoints` sizes them."""
    policy = policy or TreePolicy.autoregressive()
    t = ModelRunner(target, cache_slots(len(prompt), n, policy, draft=False))
    d = ModelRunner(draft, cache_slots(len(prompt), n, policy, draft=True)) if draft is not None else None
    sampling = SamplingParams(temperature=temperature, seed=sample_seed, top_k=sample_top_k, top_p=sample_top_p)
    cfg = GenerateConfig(mode, policy, n, tuple(eos), keep, sampling=sampling)
    return generate(t, d, prompt, cfg)


@pytest.fixture(scope="module")
def pair(make_checkpoint):
    """Per arch: target, a smaller draft (other depth/width), a noisy copy of the target."""
    cache = {}

    def get(arch: str):
        if arch not in cache:
            target = load_model(make_checkpoint(arch))
            small = load_model(make_checkpoint(arch, **SMALL_DRAFT))
            noisy = load_model(make_checkpoint(arch))  # the target + noise: accepts some, not all
            g = torch.Generator().manual_seed(7)
            with torch.no_grad():
                for p in noisy.parameters():
                    p.add_(0.02 * torch.randn(p.shape, generator=g))
            cache[arch] = (target, small, noisy)
        return cache[arch]

    return get


def prompts(seed: int, k: int = 3) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(256) for _ in range(rng.randint(1, 12))] for _ in range(k)]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", list(POLICIES))
def test_lossless(pair, arch: str, name: str) -> None:
    mode, policy, keep = POLICIES[name]
    target, small, noisy = pair(arch)
    accepted = []
    for i, prompt in enumerate(prompts(zlib.crc32(f"{arch}/{name}".encode()))):
        ref = decode(target, None, prompt).tokens
        assert len(ref) == NEW
        for draft in (small, noisy):
            res = decode(target, draft, prompt, mode, policy, keep=keep)
            assert res.tokens == ref, f"prompt {i}: speculative output differs from greedy"
            assert sum(r.accepted for r in res.records) >= NEW and res.iterations == len(res.records)
            accepted += [r.accepted for r in res.records]
    assert max(accepted) > 1  # some drafted tokens were accepted: the accept path ran


@pytest.mark.parametrize("arch", ARCHS)
def test_matches_transformers_generate(pair, make_checkpoint, arch: str) -> None:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(make_checkpoint(arch), dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None  # compare NEW tokens, whatever they are
    target, _, noisy = pair(arch)
    for prompt in prompts(11, k=2):
        with torch.no_grad():
            out = hf.generate(torch.tensor([prompt]), max_new_tokens=NEW, do_sample=False, pad_token_id=0)
        want = out[0, len(prompt) :].tolist()
        got = decode(target, noisy, prompt, Mode.serial, TreePolicy(bs=8, w=3, d=3)).tokens
        assert got == want


def test_stops_at_eos(pair) -> None:
    target, _, noisy = pair("llama")
    prompt = [3, 14, 15, 92]
    ref = decode(target, None, prompt).tokens
    k = next(i for i in range(4, NEW) if ref[i] not in ref[:i])  # first occurrence as the stop token
    res = decode(target, noisy, prompt, Mode.serial, TreePolicy(bs=8, w=2, d=3), eos=[ref[k]])
    assert res.tokens == ref[: k + 1] and res.stop == "eos"


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(
    "mode,policy,depth",
    [
        (Mode.chain, TreePolicy.chain(3), 3),
        (Mode.serial, TreePolicy(bs=5, w=1, d=4), 4),
        (Mode.serial, TreePolicy(bs=7, w=1, d=0, kind="static", topology=STATIC), 3),
    ],
    ids=["chain3", "w1-d4", "static7"],
)
def test_self_draft_is_fully_accepted(pair, arch: str, mode: Mode, policy: TreePolicy, depth: int) -> None:
    target, _, _ = pair(arch)
    prompt = prompts(5, k=1)[0]
    res = decode(target, target, prompt, mode, policy, n=20)
    assert [r.accepted for r in res.records] == [depth + 1] * res.iterations
    assert res.tokens == decode(target, None, prompt, n=20).tokens


def test_dynamic_self_draft_accepts_its_top_child(pair) -> None:
    """Dynamic tree: the root's best child is always selected, and it is the target's token."""
    target, _, _ = pair("qwen2")
    prompt = prompts(6, k=1)[0]
    res = decode(target, target, prompt, Mode.serial, TreePolicy(bs=8, w=3, d=3), n=20)
    assert all(r.accepted >= 2 for r in res.records)
    assert res.mean_accepted > 2.5
    assert res.tokens == decode(target, None, prompt, n=20).tokens


def test_random_draft_gives_identical_output(pair, make_checkpoint) -> None:
    target, _, _ = pair("llama")
    unrelated = load_model(make_checkpoint("llama"), weights="random", seed=3)
    prompt = prompts(8, k=1)[0]
    ref = decode(target, None, prompt).tokens
    assert decode(target, unrelated, prompt, Mode.serial, TreePolicy(bs=8, w=4, d=2)).tokens == ref
    assert decode(target, unrelated, prompt, Mode.chain, TreePolicy.chain(4)).tokens == ref


# ---- sampling (temperature > 0) --------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", ["chain3", "bs8-w2-d3", "bs10-w4-d4-fresh", "static7"])
def test_sampling_is_lossless(pair, arch: str, name: str) -> None:
    """Sampled speculation equals target-only sampling with the same seed, token for token: every
    produced token is the target's own draw at its output position (verify.SamplingVerifier)."""
    mode, policy, keep = POLICIES[name]
    target, small, noisy = pair(arch)
    accepted, differs = [], 0
    for i, prompt in enumerate(prompts(zlib.crc32(f"sample/{arch}/{name}".encode()), k=2)):
        for temperature, seed in ((0.5, i), (1.3, 100 + i)):
            ref = decode(target, None, prompt, temperature=temperature, sample_seed=seed)
            assert len(ref.tokens) == NEW and ref.temperature == temperature
            differs += ref.tokens != decode(target, None, prompt).tokens
            for draft in (small, noisy, target):
                res = decode(target, draft, prompt, mode, policy, keep=keep, temperature=temperature,
                             sample_seed=seed)  # fmt: skip
                assert res.tokens == ref.tokens, f"prompt {i}, T {temperature}: sampled speculation differs"
                accepted += [r.accepted for r in res.records]
    assert max(accepted) > 1  # drafted tokens were accepted: the accept path ran
    assert differs > 0  # the draws are not the greedy tokens: sampling ran


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("sample_top_k,sample_top_p", [(3, 1.0), (0, 0.6), (5, 0.8)])
def test_truncated_sampling_is_lossless(pair, arch: str, sample_top_k: int, sample_top_p: float) -> None:
    """top-k / top-p sampling: speculation equals target-only sampling with the same cut and seed,
    and every draw lies inside the cut (it differs from untruncated sampling somewhere)."""
    target, small, noisy = pair(arch)
    differs = 0
    for i, prompt in enumerate(prompts(zlib.crc32(f"cut/{arch}/{sample_top_k}/{sample_top_p}".encode()), k=2)):
        ref = decode(target, None, prompt, temperature=1.5, sample_seed=i, sample_top_k=sample_top_k,
                     sample_top_p=sample_top_p)  # fmt: skip
        assert (ref.sample_top_k, ref.sample_top_p) == (sample_top_k, sample_top_p)
        differs += ref.tokens != decode(target, None, prompt, temperature=1.5, sample_seed=i).tokens
        for draft, (mode, policy, keep) in ((small, POLICIES["bs8-w2-d3"]), (noisy, POLICIES["chain3"]),
                                            (target, POLICIES["static7"])):  # fmt: skip
            res = decode(target, draft, prompt, mode, policy, keep=keep, temperature=1.5, sample_seed=i,
                         sample_top_k=sample_top_k, sample_top_p=sample_top_p)  # fmt: skip
            assert res.tokens == ref.tokens, f"prompt {i}, {mode}: truncated sampled speculation differs"
    assert differs > 0  # the cut changed some draw: truncation ran


def test_truncated_probs_against_reference() -> None:
    """`truncated_probs` against a float64 sort-based reference: top-k keeps exactly the k best
    (ties included), top-p the smallest most-probable prefix reaching p, renormalised; the sampler
    never draws a token outside the cut and its frequencies match within 4 sigma."""
    from swiftspec.runtime.verify import sample_by_inverse_cdf, truncated_probs

    g = torch.Generator().manual_seed(7)
    logits = torch.randn(4, 60, generator=g) * 2
    logits[2, 10] = logits[2, 11] = logits[2].max() + 1  # a tie at the top
    for sample_top_k, sample_top_p in ((5, 1.0), (0, 0.7), (8, 0.5), (1, 1.0), (0, 1e-9), (60, 1.0)):
        got = truncated_probs(logits, 0.9, sample_top_k, sample_top_p).double()
        p = torch.softmax(logits.double() / 0.9, dim=-1)
        for r in range(4):
            keep = torch.ones(60, dtype=torch.bool)
            if sample_top_k:
                keep &= logits[r] >= logits[r].sort(descending=True).values[sample_top_k - 1]
            q = torch.where(keep, p[r], 0.0)
            q = q / q.sum()
            order = q.argsort(descending=True)
            mass, nucleus = 0.0, torch.zeros(60, dtype=torch.bool)
            for j in order.tolist():
                if q[j] == 0 or mass >= sample_top_p:
                    break
                nucleus[j], mass = True, mass + float(q[j])
            want = torch.where(nucleus, q, 0.0)
            want = want / want.sum()
            assert ((got[r] > 0) == nucleus).all(), (sample_top_k, sample_top_p, r)
            assert torch.allclose(got[r], want, atol=1e-6), (sample_top_k, sample_top_p, r)
    u = torch.rand(20000, generator=g, dtype=torch.float64)
    drawn = sample_by_inverse_cdf(logits[0].expand(20000, -1), u, 0.9, 8, 0.5)
    q = truncated_probs(logits[:1], 0.9, 8, 0.5)[0].double()
    assert (q[drawn] > 0).all()
    freq = torch.bincount(drawn, minlength=60).double() / 20000
    assert ((freq - q).abs() <= 4 * (q * (1 - q) / 20000).sqrt() + 1e-4).all()


def test_sampling_seeds_differ(pair) -> None:
    target, _, noisy = pair("llama")
    prompt = prompts(12, k=1)[0]
    a, b = (decode(target, noisy, prompt, Mode.serial, TreePolicy(bs=8, w=2, d=3), temperature=1.0, sample_seed=s)
            for s in (1, 2))  # fmt: skip
    assert a.tokens != b.tokens


@pytest.mark.parametrize("temperature", [0.3, 1.0, 2.5])
def test_inverse_cdf_sampler_matches_softmax(temperature: float) -> None:
    """`sample_by_inverse_cdf` against a float64 reference: the exact token for each uniform (the
    first whose cumulative probability exceeds it), and frequencies within 4 sigma of softmax."""
    from swiftspec.runtime.verify import sample_by_inverse_cdf

    g = torch.Generator().manual_seed(int(temperature * 10))
    logits = torch.randn(3, 50, generator=g) * 3
    logits[1, 7] = -float("inf")  # a token that can never be drawn
    u = torch.rand(3, 20000, generator=g, dtype=torch.float64)
    got = torch.stack([sample_by_inverse_cdf(logits[r].expand(20000, -1), u[r], temperature) for r in range(3)])
    p = torch.softmax(logits.double() / temperature, dim=-1)
    cdf = p.cumsum(-1)
    want = torch.searchsorted(cdf, (u * cdf[:, -1:]).contiguous(), right=True)
    assert (got != want).float().mean() < 1e-3  # float32 vs float64 cumsums differ only at boundaries
    assert not (got[1] == 7).any()
    freq = torch.stack([torch.bincount(got[r], minlength=50) for r in range(3)]).double() / 20000
    sigma = (p * (1 - p) / 20000).sqrt()
    assert ((freq - p).abs() <= 4 * sigma + 1e-4).all()


# ---- CLI -----------------------------------------------------------------------------------




def test_cli_json_contract(make_checkpoint, pair, swiftspec_cli) -> None:
    target, draft = make_checkpoint("qwen2"), make_checkpoint("qwen2", **SMALL_DRAFT)
    ids = [5, 6, 7, 8, 9]
    code, out, err = swiftspec_cli("generate", "--target", target, "--draft", draft, "--mode", "serial", "--bs", 6,
                          "--w", 2, "--d", 3, "--prompt-ids", "5,6,7,8,9", "--max-new-tokens", 12, "--no-eos",
                          "--json")  # fmt: skip
    assert code == 0, err
    res = json.loads(out)
    assert {"tokens", "text", "tokens_per_s", "mean_accepted", "iterations", "weights"} <= set(res)
    assert res["tokens"] == decode(pair("qwen2")[0], None, ids, n=12).tokens
    assert res["text"] is None and res["weights"] == "checkpoint" and res["tokens_per_s"] > 0
    assert res["iterations"] == len(res["records"]) and res["mean_accepted"] >= 1


def test_cli_device_loop_gives_the_host_loops_tokens(make_checkpoint, pair, swiftspec_cli) -> None:
    """`--loop device` decodes on fixed-shape tensors: the same tokens and accepted lengths as the
    host loop, and the output says which loop ran (without --loop on a CPU: host)."""
    target, draft = make_checkpoint("qwen2"), make_checkpoint("qwen2", **SMALL_DRAFT)
    args = ["generate", "--target", target, "--draft", draft, "--mode", "serial", "--bs", 6, "--w", 2, "--d", 3,
            "--prompt-ids", "5,6,7,8,9", "--max-new-tokens", 12, "--no-eos", "--json"]  # fmt: skip
    runs = {}
    for loop in ("host", "device", None):  # None: the default, the host loop off CUDA
        code, out, err = swiftspec_cli(*args, *(("--loop", loop) if loop else ()))
        assert code == 0, err
        runs[loop] = json.loads(out)
        assert runs[loop]["loop"] == (loop or "host")
    assert runs[None]["tokens"] == runs["host"]["tokens"]
    assert runs["device"]["tokens"] == runs["host"]["tokens"] == decode(pair("qwen2")[0], None, [5, 6, 7, 8, 9], n=12).tokens
    assert [r["accepted"] for r in runs["device"]["records"]] == [r["accepted"] for r in runs["host"]["records"]]
    code, _, err = swiftspec_cli(*args, "--loop", "gpu")
    assert code == 2 and "--loop" in err


def test_cli_text_prompt_random_weights(make_checkpoint, swiftspec_cli) -> None:
    target = make_checkpoint("llama", tokenizer=True)
    args = ["generate", "--target", target, "--draft", target, "--mode", "chain", "--d", 2, "--prompt", "hi there",
            "--max-new-tokens", 6, "--weights", "random", "--no-eos"]  # fmt: skip
    code, out, err = swiftspec_cli(*args, "--json")
    assert code == 0, err
    res = json.loads(out)
    assert res["weights"] == "random" and isinstance(res["text"], str) and len(res["tokens"]) == 6
    code, out, err = swiftspec_cli(*args)
    assert code == 0 and "weights: random" in out.splitlines()


def test_cli_sampling(make_checkpoint, swiftspec_cli) -> None:
    """--temperature / --sample-seed: serial speculation gives autoregressive sampling's tokens."""
    target, draft = make_checkpoint("llama"), make_checkpoint("llama", **SMALL_DRAFT)
    common = ["--target", target, "--prompt-ids", "5,6,7", "--max-new-tokens", 10, "--no-eos",
              "--temperature", 0.8, "--sample-seed", 3]  # fmt: skip
    code, out, err = swiftspec_cli("generate", *common, "--json")
    assert code == 0, err
    ref = json.loads(out)
    code, out, err = swiftspec_cli("generate", *common, "--draft", draft, "--mode", "serial", "--bs", 6, "--w", 2, "--d", 2,
                          "--json")  # fmt: skip
    assert code == 0, err
    res = json.loads(out)
    assert res["temperature"] == ref["temperature"] == 0.8 and res["tokens"] == ref["tokens"]
    code, out, err = swiftspec_cli("generate", *common)
    assert code == 0 and "temperature: 0.8 (seed 3)" in out.splitlines()[0]
    cut = ["--sample-top-k", 4, "--sample-top-p", 0.9]
    code, out, err = swiftspec_cli("generate", *common, *cut, "--json")
    assert code == 0, err
    ref = json.loads(out)
    code, out, err = swiftspec_cli("generate", *common, *cut, "--draft", draft, "--mode", "serial", "--bs", 6, "--w", 2,
                          "--d", 2, "--json")  # fmt: skip
    res = json.loads(out)
    assert code == 0 and (res["sample_top_k"], res["sample_top_p"]) == (4, 0.9)
    assert res["tokens"] == ref["tokens"]
    code, out, err = swiftspec_cli("generate", *common, *cut)
    assert code == 0 and "temperature: 0.8, top-k 4, top-p 0.9 (seed 3)" in out.splitlines()[0]


def test_cli_fp8_is_labelled_and_lossless(make_checkpoint, swiftspec_cli) -> None:
    """--weight-format fp8: the JSON says so, and serial speculation over the fp8 pair gives the
    fp8 target's own greedy tokens (--tree-growth graph falls back to torch on CPU)."""
    target, draft = make_checkpoint("llama"), make_checkpoint("llama", **SMALL_DRAFT)
    common = ["--target", target, "--prompt-ids", "5,6,7", "--max-new-tokens", 8, "--no-eos",
              "--weight-format", "fp8", "--json"]  # fmt: skip
    code, out, err = swiftspec_cli("generate", *common)
    assert code == 0, err
    ref = json.loads(out)
    code, out, err = swiftspec_cli("generate", *common, "--draft", draft, "--mode", "serial", "--bs", 6, "--w", 2, "--d", 2,
                          "--tree-growth", "graph")  # fmt: skip
    assert code == 0, err
    res = json.loads(out)
    assert res["weight_format"] == ref["weight_format"] == "fp8" and res["tokens"] == ref["tokens"]


BAD = {
    "missing": (lambda mk: ["--target", "/no/such/checkpoint", "--prompt-ids", "1,2"], "no/such/checkpoint"),
    "architecture": (lambda mk: ["--target", mk("llama", model_type="gpt2"), "--prompt-ids", "1,2"], "gpt2"),
    "vocab": (lambda mk: ["--target", mk("llama"), "--draft", mk("llama", vocab_size=300, bos_token_id=7),
                          "--mode", "chain", "--prompt-ids", "1,2"], "do not share a vocabulary"),  # fmt: skip
    "too-long": (lambda mk: ["--target", mk("llama"), "--prompt-ids", ",".join(["3"] * 40), "--max-len", 32],
                 "--max-len"),  # fmt: skip
    "cuda": (lambda mk: ["--target", mk("llama"), "--prompt-ids", "1,2", "--device", "cuda"], "no CUDA GPU"),
    "chain-w": (lambda mk: ["--target", mk("llama"), "--draft", mk("llama"), "--mode", "chain", "--w", 2,
                            "--prompt-ids", "1"], "--w 1"),  # fmt: skip
    "no-draft": (lambda mk: ["--target", mk("llama"), "--mode", "serial", "--prompt-ids", "1"], "--draft"),
    "weight-format": (lambda mk: ["--target", mk("llama"), "--prompt-ids", "1", "--weight-format", "int3"],
                      "--weight-format must be one of native, fp8, int4"),  # fmt: skip
    "tree-growth": (lambda mk: ["--target", mk("llama"), "--prompt-ids", "1", "--tree-growth", "cub"],
                    "--tree-growth must be one of"),  # fmt: skip
    "temperature": (lambda mk: ["--target", mk("llama"), "--prompt-ids", "1", "--temperature", "-0.5"],
                    "--temperature must be a finite number >= 0"),  # fmt: skip
    "top-k": (lambda mk: ["--target", mk("llama"), "--prompt-ids", "1", "--temperature", "1",
                          "--sample-top-k", "-2"], "--sample-top-k must be an integer >= 0"),  # fmt: skip
    "top-p": (lambda mk: ["--target", mk("llama"), "--prompt-ids", "1", "--temperature", "1",
                          "--sample-top-p", "1.5"], "--sample-top-p must be in (0, 1]"),  # fmt: skip
    "top-p-greedy": (lambda mk: ["--target", mk("llama"), "--prompt-ids", "1", "--sample-top-p", "0.9"],
                     "need a --temperature > 0"),  # fmt: skip
}


@pytest.mark.parametrize("case", list(BAD))
def test_cli_bad_input(case: str, make_checkpoint, swiftspec_cli) -> None:
    if case == "cuda" and torch.cuda.is_available():
        pytest.skip("a GPU is present")
    make_args, needle = BAD[case]
    code, out, err = swiftspec_cli("generate", *make_args(make_checkpoint), "--max-new-tokens", 4, "--json")  # fmt: skip
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1 and lines[0].startswith("error: "), err
    assert needle in lines[0]


def test_cli_progress_on_stderr_quiet_with_json(make_checkpoint, swiftspec_cli) -> None:
    """Model building and decoding print progress lines on stderr; --json prints none there."""
    target = make_checkpoint("llama")
    args = ["generate", "--target", target, "--draft", target, "--mode", "chain", "--d", 2,
            "--prompt-ids", "1,2,3", "--max-new-tokens", 6, "--no-eos", "--device", "cpu", "--dtype", "float32"]  # fmt: skip
    code, out, err = swiftspec_cli(*args)
    assert code == 0, err
    lines = err.splitlines()
    assert any(x.startswith("generate: target ") and " built (" in x for x in lines), err
    assert any(x.startswith("generate: draft ") and " built (" in x for x in lines), err
    assert lines[-1].startswith("generate: 6/6 tokens, ") and lines[-1].endswith(" tok/s"), err
    assert not any("tokens" in x and x.startswith("generate:") for x in out.splitlines())
    code, out, err = swiftspec_cli(*args, "--json")
    assert code == 0 and err == "" and json.loads(out)["tokens"]
