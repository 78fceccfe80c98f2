"""Checkpoint loading (single / sharded), random weights, TP slicing, bad input."""

from __future__ import annotations

import itertools
import json

import pytest
import torch

from swiftspec.kernels.tree_attention_ws import GLUON_ERROR
from swiftspec.runtime.kernel_config import (
    ATTENTION_WS_MIN_TOKENS,
    ATTENTION_WS_ROWS,
    KernelConfig,
    kernel_mismatch,
    profile_settings,
)
from swiftspec.runtime.kv_cache import KVCache
from swiftspec.runtime.weights import load_model, load_tokenizer, rank_slices
from swiftspec.spec import ModelSpec, UserError


def _logits(model, ids):
    t = len(ids)
    cache = KVCache(model.spec, model.shard, 32, "cpu", torch.float32)
    return model(torch.tensor(ids), torch.arange(t), cache, torch.arange(t), 0, torch.ones(t, t, dtype=torch.bool).tril())


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_sharded_checkpoint_equals_single_file(make_checkpoint, arch):
    single = make_checkpoint(arch, seed=3)
    sharded = make_checkpoint(arch, seed=3, max_shard_size="40KB")
    assert (sharded / "model.safetensors.index.json").exists() and not (sharded / "model.safetensors").exists()
    a, b = load_model(single), load_model(sharded)
    assert a.weights == b.weights == "checkpoint"
    for (na, pa), (nb, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert na == nb and torch.equal(pa, pb)
    ids = [5, 17, 200, 3, 99]
    assert torch.equal(_logits(a, ids), _logits(b, ids))
    assert not torch.equal(_logits(a, ids), _logits(load_model(make_checkpoint(arch, seed=4)), ids))


@pytest.mark.parametrize("heads,kv", [(4, 2), (6, 2), (8, 8), (3, 1), (32, 8), (64, 8), (28, 4), (12, 3)])
def test_rank_slices_partition_heads(heads, kv):
    spec = ModelSpec(name="t", architecture="llama", num_layers=1, hidden=heads * 4, num_heads=heads,
                     num_kv_heads=kv, head_dim=4, ffn=100, vocab=1001, qkv_bias=False, tie_embeddings=False)  # fmt: skip
    g = heads // kv
    for tp in range(1, 9):
        sh = spec.shard(tp)
        qs, ffn, vocab = [], [], []
        for r in range(tp):
            s = rank_slices(spec, tp, r)
            q = list(range(*s.q))
            assert len(q) <= sh.q_heads and s.kv[1] - s.kv[0] <= sh.kv_heads
            # every real query head sits on the rank that holds its KV head, at the same local group
            for j, h in enumerate(q):
                assert s.kv[0] <= h // g < s.kv[1]
                assert j // (sh.q_heads // sh.kv_heads) == h // g - s.kv[0]
            qs += q
            ffn += list(range(*s.ffn))
            vocab += list(range(*s.vocab))
        assert qs == list(range(heads)), tp  # each query head on exactly one rank
        assert ffn == list(range(100)) and vocab == list(range(1001))


def test_random_weights_shapes_determinism_and_padding(make_checkpoint):
    path = make_checkpoint("qwen2", num_attention_heads=6, num_key_value_heads=2, hidden_size=96)
    a = load_model(path, weights="random", seed=1)
    b = load_model(path, weights="random", seed=1)
    c = load_model(path, weights="random", seed=2)
    assert a.weights == "random"
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    assert not torch.equal(a.layers[0].wqkv, c.layers[0].wqkv)
    w = a.layers[1].w13
    assert w.shape == (2 * 128, 96) and abs(float(w.std()) - 0.02) < 0.002 and abs(float(w.mean())) < 0.002
    # tp 4 with 6 heads / 2 KV: 2 local query heads, the 4th head of each KV group is padding
    r1 = load_model(path, weights="random", seed=1, tp_rank=1, tp_size=4)
    r0 = load_model(path, weights="random", seed=1, tp_rank=0, tp_size=4)
    hd = 16
    assert r1.layers[0].wqkv.shape == ((2 + 2) * hd, 96)
    assert r1.layers[0].wqkv[hd : 2 * hd].abs().sum() == 0 and r1.layers[0].wo[:, hd:].abs().sum() == 0
    assert r1.layers[0].bqkv[hd : 2 * hd].abs().sum() == 0
    assert r0.layers[0].wqkv[hd : 2 * hd].abs().sum() > 0
    assert torch.equal(r0.embed, r1.embed) and torch.equal(r0.norm, r1.norm)  # replicated
    assert not torch.equal(r0.lm_head, r1.lm_head)  # vocab-sharded


def test_tied_embeddings_share_storage(make_checkpoint):
    m = load_model(make_checkpoint("llama", tie_word_embeddings=True))
    assert m.lm_head is m.embed
    m2 = load_model(make_checkpoint("llama", tie_word_embeddings=True), tp_rank=1, tp_size=2)
    assert torch.equal(m2.lm_head, m.embed[128:])


def test_tokenizer(make_checkpoint):
    assert load_tokenizer(make_checkpoint("llama")) is None
    tok = load_tokenizer(make_checkpoint("llama", tokenizer=True))
    ids = tok("hi there")["input_ids"]
    assert tok.decode(ids) == "hi there" and max(ids) < 256


def test_bad_input(tmp_path, make_checkpoint):
    with pytest.raises(UserError, match="unknown model"):
        load_model(tmp_path / "nope")
    gpt2 = make_checkpoint("llama", model_type="gpt2")
    with pytest.raises(UserError, match="gpt2"):
        load_model(gpt2)
    cfg_only = tmp_path / "cfg"
    cfg_only.mkdir()
    (cfg_only / "config.json").write_text((make_checkpoint("llama") / "config.json").read_text())
    with pytest.raises(UserError, match="no safetensors"):
        load_model(cfg_only)
    with pytest.raises(UserError, match="weights must be"):
        load_model(make_checkpoint("llama"), weights="zeros")
    with pytest.raises(UserError, match="attention must be"):
        load_model(make_checkpoint("llama"), kernels=KernelConfig.resolve("cpu", attention="flash"))
    bad_rope = tmp_path / "rope"
    bad_rope.mkdir()
    cfg = json.loads((make_checkpoint("llama") / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": "yarn", "factor": 2.0, "rope_theta": 10000.0,
                              "original_max_position_embeddings": 256}  # fmt: skip
    (bad_rope / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError, match="yarn"):
        load_model(bad_rope, weights="random")


def test_all_bundled_configs_build_specs():
    """Every bundled config parses and shards at every TP degree the planner may ask for."""
    from swiftspec.runtime.model import rope_inv_freq
    from swiftspec.spec import bundled_models

    for name, tp in itertools.product(bundled_models(), (1, 2, 3, 4, 8)):
        spec = ModelSpec.from_config(name)
        assert rope_inv_freq(spec).shape == (spec.head_dim // 2,)
        for r in range(tp):
            rank_slices(spec, tp, r)


def test_fold_norm_default_follows_the_skinny_linear():
    """fold_norm by default is on only where the folded path runs (CUDA, linear and fusion "triton",
    native weights) and won (TP 1), and a profile's recorded settings follow its weight format."""
    def fold(device, **kw):
        return KernelConfig.resolve(device, capability=(9, 0), **kw).fold_norm

    assert fold("cuda") is True
    assert fold("cpu") is False
    assert fold("cuda", linear="torch") is False
    assert fold("cuda", fusion="compile") is False
    assert fold("cuda", weight_format="fp8") is False
    assert fold("cuda", tp_size=2) is False and fold("cuda", fold_norm=True, tp_size=8) is True
    assert fold("cpu", linear="triton", fold_norm=True) is True and fold("cuda", fold_norm=False) is False
    with pytest.raises(UserError, match="fold_norm needs linear 'triton'"):
        fold("cpu", fold_norm=True)
    cuda = profile_settings("cuda")
    assert (cuda["fold_norm"], cuda["linear"], cuda["fusion"]) == ("tp1", "triton", "triton")
    assert profile_settings("cuda", "fp8")["fold_norm"] == "off" and profile_settings("cpu")["fold_norm"] == "off"
    assert kernel_mismatch(profile_settings("cuda", "fp8"), "cuda") == ["weight_format: profile fp8, runtime native"]
    assert kernel_mismatch({**cuda, "fold_norm": "off"}, "cuda") == ["fold_norm: profile off, runtime tp1"]


def test_swiglu_default_follows_the_skinny_linear(make_checkpoint):
    """swiglu by default is on where the gate/up skinny linear runs (CUDA, linear and fusion
    "triton") with native or fp8 weights, at any TP; on needs linear "triton"; profiles record it,
    and a profile of before it (swiglu off) is flagged."""
    def swiglu(device, **kw):
        return KernelConfig.resolve(device, **kw).swiglu

    assert swiglu("cuda") is True and swiglu("cpu") is False
    assert swiglu("cuda", linear="torch") is False and swiglu("cuda", fusion="off") is False
    assert swiglu("cuda", weight_format="fp8") is True
    assert swiglu("cpu", linear="triton", swiglu=True) is True and swiglu("cuda", swiglu=False) is False
    with pytest.raises(UserError, match="swiglu needs linear 'triton'"):
        swiglu("cpu", swiglu=True, linear="torch")
    cuda = profile_settings("cuda")
    assert cuda["swiglu"] == "on" and profile_settings("cuda", "fp8")["swiglu"] == "on"
    assert profile_settings("cpu")["swiglu"] == "off"
    assert kernel_mismatch({**cuda, "swiglu": "off"}, "cuda") == ["swiglu: profile off, runtime on"]
    path = make_checkpoint("llama")
    on = KernelConfig.resolve("cpu", linear="triton", fusion="triton", swiglu=True)
    assert load_model(path, kernels=on).kernels.swiglu
    auto = KernelConfig.resolve("cpu", linear="triton", fusion="triton")
    assert not load_model(path, kernels=auto).kernels.swiglu  # by default off on the CPU


def test_rope_default_follows_the_skinny_linear(make_checkpoint):
    """rope by default is on where the qkv skinny linear runs (CUDA, linear and fusion "triton")
    with native or fp8 weights, at any TP; on needs linear "triton" and reaches the model; profiles
    record the setting, and a profile of before it (rope off) is flagged."""
    def rope(device, **kw):
        return KernelConfig.resolve(device, **kw).rope

    assert rope("cuda") is True and rope("cpu") is False and rope("cuda", rope=True) is True
    assert rope("cuda", linear="torch") is False and rope("cuda", fusion="off") is False
    assert rope("cuda", weight_format="fp8") is True and rope("cuda", rope=False) is False
    with pytest.raises(UserError, match="rope needs linear 'triton'"):
        load_model(make_checkpoint("llama"), kernels=KernelConfig(linear="torch", rope=True))
    assert profile_settings("cuda")["rope"] == "on" and profile_settings("cpu")["rope"] == "off"
    assert profile_settings("cuda", "fp8")["rope"] == "on"
    assert kernel_mismatch({**profile_settings("cuda"), "rope": "off"}, "cuda") == ["rope: profile off, runtime on"]
    on = KernelConfig.resolve("cpu", linear="triton", fusion="triton", rope=True)
    model = load_model(make_checkpoint("llama"), kernels=on)
    assert model.kernels.rope and not model.kernels.swiglu
    auto = KernelConfig.resolve("cpu", linear="triton", fusion="triton")
    assert not load_model(make_checkpoint("llama"), kernels=auto).kernels.rope  # by default off on the CPU


def test_attention_ws_setting(make_checkpoint):
    """attention_ws: by default on for native weights on CUDA (sm_90; with no GPU to ask, the bundled
    profile's H200) with attention "triton", off otherwise; on means from ATTENTION_WS_ROWS rows per
    KV head and needs attention "triton" (and, to run, a GPU with Gluon); profiles record it, and one
    measured with it off is flagged against the runtime."""
    gpu_is_sm90 = not torch.cuda.is_available() or torch.cuda.get_device_capability() == (9, 0)

    def ws(device, **kw):
        return KernelConfig.resolve(device, **kw).attention_ws_rows

    assert ws("cuda") == (ATTENTION_WS_ROWS if gpu_is_sm90 else 0) and ATTENTION_WS_ROWS == 128
    assert KernelConfig.resolve("cuda", capability=(9, 0)).attention_ws_min_tokens == ATTENTION_WS_MIN_TOKENS == 32
    assert ws("cuda", attention_ws_rows=0) == 0 and ws("cpu") == 0
    assert ws("cuda", weight_format="fp8") == 0 and ws("cuda", attention="torch") == 0
    assert ws("cuda", capability=(8, 0)) == 0 and ws("cuda", capability=(10, 0)) == 0
    with pytest.raises(UserError, match="attention 'triton'"):
        ws("cuda", attention="torch", attention_ws_rows=ATTENTION_WS_ROWS)
    cuda = profile_settings("cuda")
    assert cuda["attention_ws"] == ("on" if gpu_is_sm90 else "off")
    assert profile_settings("cpu")["attention_ws"] == "off" and profile_settings("cuda", "fp8")["attention_ws"] == "off"
    flip = "off" if cuda["attention_ws"] == "on" else "on"
    assert kernel_mismatch({**cuda, "attention_ws": flip}, "cuda") == [
        f"attention_ws: profile {flip}, runtime {cuda['attention_ws']}"]
    path = make_checkpoint("llama")
    assert load_model(path).kernels.attention_ws_rows == 0
    ws_on = KernelConfig(attention="triton", attention_ws_rows=ATTENTION_WS_ROWS)
    if GLUON_ERROR:
        with pytest.raises(UserError, match="needs Triton's Gluon"):
            load_model(path, kernels=ws_on)
    else:  # kept; on CPU each forward falls back to the Triton kernel (`check_ws`)
        assert load_model(path, kernels=ws_on).kernels.attention_ws_rows == ATTENTION_WS_ROWS
