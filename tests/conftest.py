"""Shared fixtures: tiny Hugging Face checkpoints built on the fly (no download).

`make_checkpoint(arch="llama"|"qwen2", **overrides) -> Path` writes a random-init checkpoint with
`save_pretrained` (safetensors, float32) and returns its folder. Same arguments -> same folder
(cached once per pytest run), so calling it in many tests is cheap.

Defaults: hidden 64, 4 heads / 2 KV heads (head_dim 16), 2 layers, ffn 128, vocab 256,
max_position_embeddings 512, untied embeddings, rms_norm_eps 1e-6.

Keyword arguments:
    any config field     e.g. num_hidden_layers=3, num_attention_heads=6, tie_word_embeddings=True,
                         rope_parameters={"rope_type": "llama3", "factor": 8.0, ...}
                         (transformers 5 name; `rope_scaling=` is accepted too and renamed)
    seed=0               weights seed (different seeds -> different models with the same shapes)
    weight_std=0.1       std of the random linear/embedding weights. Larger than HF's 0.02 so the
                         logits are spread out (greedy argmax far from ties) and attention is not
                         uniform; norm weights are 1 + 0.1*N(0,1) and biases 0.1*N(0,1), so every
                         parameter matters in the comparisons.
    max_shard_size=None  e.g. "20KB" to write a sharded checkpoint (model.safetensors.index.json)
    tokenizer=False      True: also save a byte-level tokenizer (256 byte tokens, no merges), so
                         `--prompt TEXT` works; needs vocab_size >= 256.
    model_type="gpt2"    with arch="llama": writes only a config.json claiming that architecture
                         (for "unsupported architecture" tests).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

_DEFAULTS = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)


def _byte_tokenizer():
    """A GPT-2-style byte-level tokenizer with 256 tokens and no merges (built offline)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def build_checkpoint(
    folder: Path,
    arch: str = "llama",
    *,
    seed: int = 0,
    weight_std: float = 0.1,
    max_shard_size: str | None = None,
    tokenizer: bool = False,
    **overrides,
) -> Path:
    """Write a tiny random checkpoint of `arch` into `folder` (see the module docstring)."""
    folder.mkdir(parents=True, exist_ok=True)
    if "model_type" in overrides:  # a config of an architecture we do not support
        cfg = {**_DEFAULTS, **overrides}
        (folder / "config.json").write_text(json.dumps(cfg))
        return folder
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    if "rope_scaling" in overrides:
        overrides["rope_parameters"] = overrides.pop("rope_scaling")
    kw = {**_DEFAULTS, **overrides}
    if arch == "llama":
        cfg, cls = LlamaConfig(**kw), LlamaForCausalLM
    elif arch == "qwen2":
        cfg, cls = Qwen2Config(**kw), Qwen2ForCausalLM
    else:
        raise ValueError(f"unknown arch {arch}")
    torch.manual_seed(seed)
    model = cls(cfg).float().eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if "norm" in name:
                p.copy_(1.0 + 0.1 * noise)
            elif name.endswith("bias"):
                p.copy_(0.1 * noise)
            else:
                p.copy_(weight_std * noise)
    kwargs = {"safe_serialization": True} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(folder, **kwargs)
    if tokenizer:
        _byte_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models: one intra-op thread is faster (and 2 threads crawl on a shared CPU). A module
    asks for it with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def make_checkpoint(tmp_path_factory):
    """Factory fixture: `make_checkpoint(arch="llama"|"qwen2", **overrides) -> Path` (cached)."""
    cache: dict[str, Path] = {}

    def make(arch: str = "llama", **overrides) -> Path:
        key = json.dumps({"arch": arch, **overrides}, sort_keys=True, default=str)
        if key not in cache:
            folder = tmp_path_factory.mktemp(f"ckpt-{arch}")
            cache[key] = build_checkpoint(folder, arch, **overrides)
        return cache[key]

    return make


@pytest.fixture
def swiftspec_cli(monkeypatch, capsys):
    """`swiftspec_cli(*args) -> (exit code, stdout, stderr)`: `swiftspec ARGS` run in this process
    through `cli.main`, as a user's shell would (arguments as strings; earlier output dropped)."""
    from swiftspec.cli import main

    def run(*args) -> tuple[int, str, str]:
        monkeypatch.setattr("sys.argv", ["swiftspec", *map(str, args)])
        capsys.readouterr()
        code = 0
        try:
            main()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        out, err = capsys.readouterr()
        return code, out, err

    return run
