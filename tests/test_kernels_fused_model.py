"""The model with `KernelConfig.fusion` "triton" (add+RMSNorm, RoPE+KV write, silu*up kernels) and
`linear` "triton" (the skinny-linear kernel for forwards of <= 16 tokens) against the eager
model ("off", F.linear): logits and KV cache to 1e-5 in float32, and lossless speculative decoding.

CPU under TRITON_INTERPRET=1 on the tiny checkpoints of conftest.py; the GPU test (marked gpu)
replays CUDA graphs with fusion on against the eager unfused model.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from swiftspec.kernels.gemv import Epilogue
from swiftspec.runtime.decoder import ModelRunner
from swiftspec.runtime.generate import GenerateConfig, cache_slots, generate
from swiftspec.runtime.kernel_config import KernelConfig
from swiftspec.runtime.kv_cache import KVCache
from swiftspec.runtime.tree import top_logprobs_host
from swiftspec.runtime.weights import load_model
from swiftspec.spec import Mode, TreePolicy, UserError

HAS_CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
if not HAS_CUDA and not INTERPRET:
    pytest.skip("Triton kernels need a GPU or TRITON_INTERPRET=1", allow_module_level=True)

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32, "rope_theta": 500000.0}  # fmt: skip
CONFIGS = {
    "llama-tied-llama3": ("llama", dict(tie_word_embeddings=True, rope_parameters=LLAMA3)),
    "llama-linear-3layers": ("llama", dict(rope_parameters={"rope_type": "linear", "factor": 4.0},
                                           num_hidden_layers=3)),
    "qwen2-bias": ("qwen2", {}),
}  # fmt: skip
# The CPU tests push CPU tensors through Triton: only under the interpreter (on a GPU machine
# without it they would hand host pointers to the GPU launcher).
cpu_interpreted = pytest.mark.skipif(not INTERPRET, reason="CPU tensors through Triton need TRITON_INTERPRET=1")
PROMPTS = {"llama": [3, 14, 15, 92, 65], "qwen2": [200, 1, 77]}
# the skinny linear with the fused small ops: the CUDA path, on CPU tensors
TRITON = KernelConfig(fusion="triton", linear="triton")


def epilogue_of(kw: dict) -> Epilogue:
    """The epilogue a spied `gemv` call got (none: the plain product)."""
    return kw.get("epilogue") or Epilogue()


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def tree(n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random tree: ancestor mask (n, n) incl. self, and depths (n,)."""
    mask = torch.zeros(n, n, dtype=torch.bool)
    depth = torch.zeros(n, dtype=torch.long)
    for i in range(n):
        p = int(torch.randint(0, i, (1,), generator=gen)) if i else -1
        mask[i, i] = True
        if p >= 0:
            mask[i] |= mask[p]
            depth[i] = depth[p] + 1
    return mask, depth


def steps(model, gen_seed: int) -> tuple[list[torch.Tensor], KVCache]:
    """Prefill 20 tokens, verify a 9-node tree, then a draft-style step (3 new leaves seeing a
    6-node tree region, non-square mask). Returns the three logits and the cache."""
    gen = torch.Generator().manual_seed(gen_seed)
    cache = KVCache(model.spec, model.shard, 48, "cpu", torch.float32)
    p = 20
    ar = torch.arange(p)
    prompt = torch.randint(0, model.spec.vocab, (p,), generator=gen)
    out = [model(prompt, ar, cache, ar, 0, torch.ones(p, p, dtype=torch.bool).tril())]
    mask, depth = tree(9, gen)
    toks = torch.randint(0, model.spec.vocab, (9,), generator=gen)
    out.append(model(toks, p + depth, cache, p + torch.arange(9), torch.tensor(p), mask))
    out.append(model(toks[6:], p + depth[6:], cache, p + 9 + torch.arange(3), p + 9, mask[6:, :6]))
    return out, cache


@cpu_interpreted
@pytest.mark.parametrize("name,attention,fusion,linear", [
    ("llama-tied-llama3", "torch", "triton", "torch"), ("llama-tied-llama3", "triton", "triton", "torch"),
    ("llama-linear-3layers", "ref", "triton", "torch"), ("qwen2-bias", "torch", "triton", "torch"),
    ("llama-tied-llama3", "triton", "triton", "triton"), ("qwen2-bias", "torch", "off", "triton"),
])  # fmt: skip
def test_triton_fusion_matches_off(make_checkpoint, name, attention, fusion, linear):
    """Prefill (20 tokens: F.linear even with linear "triton"), a 9-node verify and a 3-leaf draft
    step (the skinny linear with linear "triton")."""
    arch, kw = CONFIGS[name]
    path = make_checkpoint(arch, **kw)
    results = []
    calls = []
    for fu, li in (("off", "torch"), (fusion, linear)):
        model = load_model(path, kernels=KernelConfig(attention=attention, linear=li, fusion=fu))
        if model._gemv is not None:  # count the skinny-linear calls (a spy; the kernel itself runs)
            kernel = model._gemv
            model._gemv = lambda *a, kernel=kernel, **kw: calls.append(a[0].shape[0]) or kernel(*a, **kw)
        results.append(steps(model, 11))
    layers = model.spec.num_layers
    assert calls == ([] if linear == "torch" else [9] * (4 * layers + 1) + [3] * (4 * layers + 1))
    (ref, ref_cache), (got, got_cache) = results
    for g, r in zip(got, ref):
        assert g.shape == r.shape and rel_err(g, r) <= 1e-5
    assert rel_err(got_cache.kv, ref_cache.kv) <= 1e-5
    # the tree step really used the fused path: a different model output would differ by >> 1e-5
    assert rel_err(got[1], ref[2][:1].expand_as(ref[1])) > 1e-3


@cpu_interpreted
@pytest.mark.parametrize("name", list(CONFIGS))
def test_fold_norm_matches_off(make_checkpoint, name):
    """fold_norm (with linear "triton"): the norm weights folded into the GEMMs after them
    (a tied LM head gets its own copy, the embedding stays), and every add+RMSNorm of the <= 16-token
    steps runs inside the next skinny-linear launch (the 20-token prefill keeps add_rmsnorm); logits
    and cache equal the unfolded eager model's to 1e-5; without linear "triton" it is refused."""
    arch, overrides = CONFIGS[name]
    path = make_checkpoint(arch, **overrides)
    ref, ref_cache = steps(load_model(path), 11)
    model = load_model(path, kernels=dataclasses.replace(TRITON, fold_norm=True))
    norms, folded = [], []
    add_rmsnorm, rope, act = model._fused_ops
    model._fused_ops = (lambda x, *a, **kw: norms.append(x.shape[0]) or add_rmsnorm(x, *a, **kw), rope, act)
    kernel = model._gemv
    model._gemv = lambda x, *a, **kw: (epilogue_of(kw).rms_eps is not None and folded.append(x.shape[0])) or kernel(
        x, *a, **kw)
    got, got_cache = steps(model, 11)
    layers = model.spec.num_layers
    assert norms == [20] * (2 * layers + 1) and folded == [9] * (2 * layers + 1) + [3] * (2 * layers + 1)
    for g, r in zip(got, ref):
        assert rel_err(g, r) <= 1e-5
    assert rel_err(got_cache.kv, ref_cache.kv) <= 1e-5
    with pytest.raises(UserError, match="fold_norm needs linear 'triton'"):
        dataclasses.replace(model.kernels, linear="torch")


@cpu_interpreted
@pytest.mark.parametrize("name,fold,swiglu,rope", [("llama-linear-3layers", False, True, False),
                                                   ("qwen2-bias", True, True, False),
                                                   ("llama-tied-llama3", True, True, True),
                                                   ("qwen2-bias", False, False, True)])
def test_gemm_epilogues_match_off(make_checkpoint, name, fold, swiglu, rope):
    """swiglu and/or rope (with linear "triton"): the <= 16-token steps compute silu(gate) *
    up in the gate/up skinny linear's epilogue (no silu_mul launch) and RoPE + the KV write in the
    qkv one's (no rope_kv launch); the 20-token prefill keeps both launches. With and without the
    folded norm and a qkv bias; logits and cache equal the eager model's to 1e-5."""
    arch, overrides = CONFIGS[name]
    path = make_checkpoint(arch, **overrides)
    ref, ref_cache = steps(load_model(path), 11)
    model = load_model(path, kernels=dataclasses.replace(TRITON, fold_norm=fold, swiglu=swiglu, rope=rope))
    acts, ropes, epilogues = [], [], []
    norm, rope_kv, act = model._fused_ops
    model._fused_ops = (norm, lambda x, *a, **kw: ropes.append(x.shape[0]) or rope_kv(x, *a, **kw),
                        lambda x, **kw: acts.append(x.shape[0]) or act(x, **kw))
    kernel = model._gemv
    model._gemv = lambda x, *a, **kw: ((epilogue_of(kw).act or epilogue_of(kw).rope) and epilogues.append(
        x.shape[0])) or kernel(x, *a, **kw)
    got, got_cache = steps(model, 11)
    layers = model.spec.num_layers
    steps_small = [9] * layers + [3] * layers
    assert acts == [20] * layers + ([] if swiglu else steps_small)
    assert ropes == [20] * layers + ([] if rope else steps_small)
    assert sorted(epilogues) == sorted(steps_small * (int(swiglu) + int(rope)))
    for g, r in zip(got, ref):
        assert rel_err(g, r) <= 1e-5
    assert rel_err(got_cache.kv, ref_cache.kv) <= 1e-5
    with pytest.raises(UserError, match="swiglu, rope need linear 'triton'"):  # no skinny linear to act on
        KernelConfig(linear="torch", swiglu=True, rope=True)


@cpu_interpreted
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
def test_split_k_epilogues_match_off(make_checkpoint, monkeypatch):  # (the warnings: the early-finishing splits)
    """Every skinny linear of the <= 16-token steps split in 2 along K (the rule a TP shard's narrow
    qkv GEMM takes, forced on the tiny model): the folded norm (1 / rms and the qkv bias applied in
    the split-sum launch), swiglu and rope still give the eager model's logits and cache to 1e-5.
    With linear_combine "kernel" (the sums inside the linears' launches, counted in the model's
    workspace) the logits and cache are those of the split-sum launches bit for bit, and the
    counters are zero after."""
    from swiftspec.kernels import gemv as gemv_mod

    path = make_checkpoint("qwen2", hidden_size=384, intermediate_size=512)  # K > one 256-wide step
    ref, ref_cache = steps(load_model(path), 11)
    monkeypatch.setattr(gemv_mod, "SPLIT_RULES", ((10**6, 1, 2),))
    spec = load_model(path).spec
    assert gemv_mod.dot_config(9, spec.hidden, spec.hidden, 4, 4, residual=True, norm=True).split_k == 2
    kernels = dataclasses.replace(TRITON, fold_norm=True, swiglu=True, rope=True)
    model = load_model(path, kernels=kernels)
    got, got_cache = steps(model, 11)
    for g, r in zip(got, ref):
        assert rel_err(g, r) <= 1e-5
    assert rel_err(got_cache.kv, ref_cache.kv) <= 1e-5
    combined = model.with_kernels(dataclasses.replace(kernels, linear_combine="kernel"))
    got_k, got_k_cache = steps(combined, 11)
    assert all(torch.equal(a, b) for a, b in zip(got_k, got)) and torch.equal(got_k_cache.kv, got_cache.kv)
    assert int(combined._workspace.counters.abs().sum()) == 0
    combined._workspace.counters.fill_(1)  # counts the model's linears read: a split then finishes too early
    assert not torch.equal(steps(combined, 11)[0][1], got[1])


@cpu_interpreted
def test_load_model_fold_norm(make_checkpoint):
    """load_model with fold_norm folds the norms once the weights are read (norm weights ones, the
    same logits as the unfolded model to 1e-5); the CPU's default leaves them; fold_norm without the
    skinny linear or with fp8 weights is refused before any weight is read."""
    path = make_checkpoint("llama", tie_word_embeddings=True)
    ref, _ = steps(load_model(path), 11)
    model = load_model(path, kernels=dataclasses.replace(TRITON, fold_norm=True))
    assert model.kernels.fold_norm and bool((model.norm == 1).all()) and model.lm_head is not model.embed
    got, _ = steps(model, 11)
    for g, r in zip(got, ref):
        assert rel_err(g, r) <= 1e-5
    auto = load_model(path, kernels=KernelConfig.resolve("cpu", fusion="triton", linear="triton"))
    assert not auto.kernels.fold_norm and not bool((auto.norm == 1).all())
    with pytest.raises(UserError, match="fold_norm needs linear 'triton'"):
        load_model(path, kernels=KernelConfig.resolve("cpu", linear="torch", fold_norm=True))
    with pytest.raises(UserError, match="fold_norm needs native weights"):
        load_model(path, kernels=KernelConfig.resolve("cpu", linear="triton", fold_norm=True, weight_format="fp8"))


@cpu_interpreted
def test_skinny_linear_up_to_max_rows(make_checkpoint):
    """linear "triton" with linear_max_rows 32: the 20-token prefill takes the skinny linear too, and
    the logits still equal the eager model's; linear_max_rows outside 1..256 is one clear error."""
    path = make_checkpoint("llama")
    ref, _ = steps(load_model(path), 11)
    model = load_model(path, kernels=KernelConfig(linear="triton", linear_max_rows=32))
    calls, kernel = [], model._gemv
    model._gemv = lambda *a, **kw: calls.append(a[0].shape[0]) or kernel(*a, **kw)
    got, _ = steps(model, 11)
    assert sorted(set(calls)) == [3, 9, 20]
    for g, r in zip(got, ref):
        assert rel_err(g, r) <= 1e-5
    for bad in (0, 257):
        with pytest.raises(UserError, match="max_rows must be in 1..256"):
            load_model(path, kernels=KernelConfig(linear="triton", linear_max_rows=bad))


@cpu_interpreted
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_lossless_generate_with_triton_fusion(make_checkpoint, arch):
    """Speculative decoding with the fused target and draft equals the unfused target's greedy
    output token for token (draft: the target plus noise, so some drafts are accepted, some not)."""
    torch.set_num_threads(1)
    target_off = load_model(make_checkpoint(arch))
    target, draft = (load_model(make_checkpoint(arch), kernels=TRITON) for _ in range(2))
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=g))
    n, policy, prompt = 12, TreePolicy(bs=6, w=2, d=3), PROMPTS[arch]
    auto = TreePolicy.autoregressive()
    t = ModelRunner(target_off, cache_slots(len(prompt), n, auto, draft=False))
    ref = generate(t, None, prompt, GenerateConfig(Mode.autoregressive, auto, n)).tokens
    t = ModelRunner(target, cache_slots(len(prompt), n, policy, draft=False))
    d = ModelRunner(draft, cache_slots(len(prompt), n, policy, draft=True))
    res = generate(t, d, prompt, GenerateConfig(Mode.serial, policy, n))
    assert res.tokens == ref and len(ref) == n
    assert res.iterations < n - 1  # drafts were accepted: fewer target steps than tokens


@cpu_interpreted
def test_kernel_config_reaches_the_model(make_checkpoint):
    path = make_checkpoint("llama")
    model = load_model(path)
    assert model.kernels.fusion == "off" and model._fused_ops is None  # the CPU default
    assert load_model(path, kernels=KernelConfig(fusion="compile")).kernels.fusion == "compile"
    fused = load_model(path, kernels=KernelConfig(fusion="triton"))
    assert fused.kernels.fusion == "triton" and fused._fused_ops is not None
    with pytest.raises(UserError, match="fusion must be one of off, compile, triton"):
        KernelConfig(fusion="cuda")
    assert model.kernels.attention_combine == "separate"  # tree attention's default merge of split-KV partials
    with pytest.raises(UserError, match="combine must be"):
        KernelConfig(attention="triton", attention_combine="atomic")
    assert model.kernels.linear == "torch" and model._gemv is None  # load_model's default on CPU
    with pytest.raises(UserError, match="linear must be one of torch, triton"):
        KernelConfig(linear="cublas")


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("attention,linear,pdl", [("torch", "torch", "off"), ("triton", "torch", "off"),
                                                  ("triton", "triton", "off"), ("triton", "triton", "early"),
                                                  ("triton", "triton+foldnorm", "off"), ("triton", "triton+foldnorm", "early"),
                                                  ("triton", "triton+foldnorm+swiglu", "off"),
                                                  ("triton", "triton+foldnorm+swiglu+rope", "off"),
                                                  ("triton", "triton+foldnorm+swiglu+rope", "late")])
def test_gpu_graph_runner_with_triton_fusion(make_checkpoint, attention, linear, pdl):
    from swiftspec.runtime.graphs import GraphRunner

    path = make_checkpoint("llama")
    ref_model = load_model(path, device="cuda",
                           kernels=KernelConfig.resolve("cuda", attention=attention, fusion="off", linear="torch"))
    kernels = KernelConfig.resolve("cuda", attention=attention, fusion="triton", linear=linear.split("+")[0], pdl=pdl,
                                   fold_norm="+foldnorm" in linear, swiglu="+swiglu" in linear, rope="+rope" in linear)
    model = load_model(path, device="cuda", kernels=kernels)
    gen = torch.Generator().manual_seed(5)
    mask, depth = tree(11, gen)
    toks = torch.randint(0, 256, (11,), generator=gen)
    args = (toks.cuda(), (20 + depth).cuda(), (20 + torch.arange(11)).cuda(), 20, mask.cuda())
    ar = torch.arange(20, device="cuda")
    causal = torch.ones(20, 20, dtype=torch.bool, device="cuda").tril()
    eager_cache = KVCache(model.spec, model.shard, 64, "cuda", torch.float32)
    graph_cache = KVCache(model.spec, model.shard, 64, "cuda", torch.float32)
    ref_model(ar, ar, eager_cache, ar, 0, causal)
    model(ar, ar, graph_cache, ar, 0, causal)
    runner = GraphRunner(model, graph_cache, buckets=(1, 4, 16), max_tree=32)
    ref = ref_model(args[0], args[1], eager_cache, *args[2:])
    for _ in range(3):  # replays are repeatable (workspace counters reset, cache slots rewritten)
        got = runner.run(*args)
        assert runner.eager_calls == 0
        assert rel_err(got, ref) <= 1e-4
    torch.testing.assert_close(graph_cache.k[:, :, :31], eager_cache.k[:, :, :31], rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("policy", [TreePolicy(bs=6, w=2, d=3), TreePolicy(bs=12, w=4, d=3)])
def test_gpu_graph_tree_growth_is_lossless_and_used(make_checkpoint, policy):
    """tree growth "graph": the draft's top-k replayed from captured graphs on the static logits
    (pending rows in front, a vocabulary cut) gives the same tokens as the eager kernel, and the
    graphs were used."""
    path = make_checkpoint("llama")
    target = load_model(path, device="cuda")
    draft_path = make_checkpoint("llama", num_hidden_layers=1)
    prompt, n = PROMPTS["llama"], 16
    outs = {}
    for growth in ("triton", "graph"):
        draft = load_model(draft_path, device="cuda", kernels=KernelConfig.resolve("cuda", tree_growth=growth))
        t = ModelRunner(target, cache_slots(len(prompt), n, policy, draft=False))
        d = ModelRunner(draft, cache_slots(len(prompt), n, policy, draft=True), vocab_limit=250)
        outs[growth] = generate(t, d, prompt, GenerateConfig(Mode.serial, policy, n)).tokens
        if growth == "graph":
            assert d.graphs.topk_graphs, "no top-k graph was replayed"
            logits = d.forward_tree([5, 6], [0, 1], [0, 1], torch.tensor([[True, False], [True, True]]))
            got = d.top_logprobs(logits, 3)
            ref_v, ref_i = top_logprobs_host(logits, 3, "triton")
            assert got[1] == ref_i and max(abs(a - b) for r, q in zip(got[0], ref_v) for a, b in zip(r, q)) < 1e-5
    auto = TreePolicy.autoregressive()
    t = ModelRunner(target, cache_slots(len(prompt), n, auto, draft=False))
    ref = generate(t, None, prompt, GenerateConfig(Mode.autoregressive, auto, n)).tokens
    assert outs["graph"] == outs["triton"] == ref
