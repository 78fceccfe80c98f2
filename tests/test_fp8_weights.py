"""Weight-only fp8 (`load_model(kernels=KernelConfig(weight_format="fp8"))`): the fp8 skinny linear path equals the
dequantized reference path through the whole model, the quantized model stays close to the
original, and speculative decoding over fp8 models is still lossless against the fp8 target."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from swiftspec.kernels.gemv import quantize_fp8
from swiftspec.runtime.decoder import ModelRunner
from swiftspec.runtime.generate import GenerateConfig, cache_slots, generate
from swiftspec.runtime.kernel_config import KernelConfig
from swiftspec.runtime.kv_cache import KVCache
from swiftspec.runtime.weights import load_model
from swiftspec.spec import Mode, TreePolicy, UserError

FP8 = KernelConfig.resolve("cpu", weight_format="fp8")  # the CPU's kernels, fp8 GEMM weights
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def logits_of(model, ids: list[int]) -> torch.Tensor:
    cache = KVCache(model.spec, model.shard, 64, "cpu", torch.float32)
    t = len(ids)
    ar = torch.arange(t)
    return model(torch.tensor(ids), ar, cache, ar, 0, torch.ones(t, t, dtype=torch.bool).tril())


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("tie", [False, True])
def test_fp8_model_is_quantized_and_close(make_checkpoint, tie):
    path = make_checkpoint("llama", tie_word_embeddings=tie)
    native, fp8 = load_model(path), load_model(path, kernels=FP8)
    assert fp8.weight_format == "fp8" and fp8.layers[0].w13.dtype == torch.float8_e4m3fn
    assert fp8.layers[0].w13_quant.shape == (fp8.layers[0].w13.shape[0],)
    assert fp8.lm_head.dtype == torch.float8_e4m3fn and fp8.embed.dtype == torch.float32  # own LM head copy
    # quantized while filling: the same as quantizing the native model's weights afterwards
    w8, scale = quantize_fp8(native.layers[1].w13)
    assert torch.equal(fp8.layers[1].w13.view(torch.uint8), w8.view(torch.uint8))
    assert torch.equal(fp8.layers[1].w13_quant, scale)
    w8, scale = quantize_fp8(native.lm_head)
    assert torch.equal(fp8.lm_head.view(torch.uint8), w8.view(torch.uint8)) and torch.equal(fp8.lm_head_quant, scale)
    ids = [3, 14, 15, 92, 65, 35]
    ref, got = logits_of(native, ids), logits_of(fp8, ids)
    assert 0 < rel(got, ref) < 0.15  # quantized: different, but by e4m3 rounding only
    with pytest.raises(UserError, match="weight_format must be one of"):
        load_model(path, kernels=KernelConfig.resolve("cpu", weight_format="int3"))


def test_cpu_dequantized_copies_are_exact_and_follow_weight_changes(make_checkpoint):
    """The CPU reference path keeps each fp8 weight's dequantized copy after its first use: the
    logits equal the per-call dequantization bit for bit, and writing a weight again
    (`set_gemm_weight`) drops the copies, so the next forward sees the new weight."""
    path = make_checkpoint("llama")
    model = load_model(path, kernels=FP8)
    ids = [3, 14, 15, 92, 65, 35]
    first = logits_of(model, ids)
    assert model._dequantized  # kept
    layer = model.layers[0]
    per_call = layer.w13.to(torch.float32) * layer.w13_quant[:, None]
    assert torch.equal(model._dequantized[(layer.w13.data_ptr(), torch.float32)], per_call)
    assert torch.equal(logits_of(model, ids), first)
    w13 = per_call * 2.0
    model.set_gemm_weight(layer, "w13", w13)
    assert not model._dequantized
    changed = logits_of(model, ids)
    assert not torch.equal(changed, first)
    fresh = load_model(path, kernels=FP8)
    fresh.set_gemm_weight(fresh.layers[0], "w13", w13)
    assert torch.equal(logits_of(fresh, ids), changed)


@pytest.mark.skipif(not INTERPRET, reason="the fp8 kernel path on CPU needs TRITON_INTERPRET=1")
def test_fp8_kernel_path_equals_dequantized_path(make_checkpoint):
    path = make_checkpoint("qwen2")  # qkv bias: the bias rides on the fp8 GEMM too
    ids = list(range(5, 25))
    ref = logits_of(load_model(path, kernels=FP8), ids)  # fp8 weights dequantized: the reference
    # the fp8 skinny linear at 20 rows (prefill) ...
    model = load_model(path, kernels=dataclasses.replace(FP8, linear="triton"))
    assert rel(logits_of(model, ids), ref) <= 1e-4
    assert rel(logits_of(model, ids[:1]), ref[:1]) <= 1e-4  # ... and at 1 row


@pytest.mark.parametrize("mode,policy", [(Mode.serial, TreePolicy(bs=6, w=2, d=3)), (Mode.chain, TreePolicy.chain(3))])
def test_speculation_over_fp8_models_is_lossless(make_checkpoint, mode, policy):
    target = load_model(make_checkpoint("llama"), kernels=FP8)
    draft = load_model(make_checkpoint("llama", num_hidden_layers=1, seed=4), kernels=FP8)
    prompt, n = [3, 14, 15, 92], 12
    auto = TreePolicy.autoregressive()
    t = ModelRunner(target, cache_slots(len(prompt), n, auto, draft=False))
    ref = generate(t, None, prompt, GenerateConfig(Mode.autoregressive, auto, n)).tokens
    t = ModelRunner(target, cache_slots(len(prompt), n, policy, draft=False))
    d = ModelRunner(draft, cache_slots(len(prompt), n, policy, draft=True))
    assert generate(t, d, prompt, GenerateConfig(mode, policy, n)).tokens == ref
